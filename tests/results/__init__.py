"""sweeper/results: trial results, Parquet rows, step-to-step noise."""
