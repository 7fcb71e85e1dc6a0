"""Run one layout of a sweep by hand, on local processes."""

from __future__ import annotations


def trial() -> None:
    raise SystemExit("not yet available")
