"""`python -m sweeper.cli ...` is the `sweep` command (how launchers start trials in a subprocess)."""

from sweeper.cli import main

main()
