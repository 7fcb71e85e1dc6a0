"""sweeper/spec: the sweep file, the model and GPU catalogues, config.json."""
