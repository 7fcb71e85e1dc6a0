"""sweeper/search: the search over layouts and node counts, its calibration, learned profiles."""
