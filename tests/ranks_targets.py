"""Functions a test launches on local ranks (`sweeper.launchers.ranks.launch`, task kind "call")."""

from __future__ import annotations

from pathlib import Path


def write_nothing(*, out_dir: Path) -> None:
    """A rank that ends at once and reports nothing."""
