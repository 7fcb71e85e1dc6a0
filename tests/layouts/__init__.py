"""sweeper/layouts: the validity rules of a layout."""
