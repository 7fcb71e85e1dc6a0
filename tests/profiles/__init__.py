"""sweeper/profiles: the measured profile file and its tables."""
