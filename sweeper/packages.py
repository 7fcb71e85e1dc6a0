"""Packages a kernel needs, read from their installed metadata (no import of the package, no torch).

The plan asks here which kernels this installation has (`Trainer.attention_missing`), and the
built-in trainer's kernel probe (`sweeper.runtime.kernels`, which `sweep selftest` runs) asks the
same function, so the two always agree on what is installed.
"""

from __future__ import annotations

import importlib.metadata


def flash_attn_major() -> int | None:
    """The major version of the installed flash-attn package, or None when it is not installed."""
    try:
        return int(importlib.metadata.version("flash-attn").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
