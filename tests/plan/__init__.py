"""sweeper/plan: the plan, the dry run's records and the answer per node count."""
