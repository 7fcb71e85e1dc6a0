"""sweeper/estimate: memory, FLOPs, the step-time models (table and profiled), their error bands."""
