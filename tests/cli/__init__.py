"""sweeper/cli: the `sweep` commands as a user runs them (output, formats, exit codes)."""
