"""What README.md and docs/ show, read as printed."""
