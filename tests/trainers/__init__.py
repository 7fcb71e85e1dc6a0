"""sweeper/trainers: each trainer's rules, traits and exports, read back with the trainers' own parsers."""
