"""The trainer tests write torch's scratch files (inductor cache, launch folders) under pytest's tmp dir."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def private_tmpdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Inductor's cache and every launch's scratch files go under pytest's tmp dir, cleaned by pytest."""
    path = tmp_path_factory.mktemp("torch-tmp")
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(path)
    tempfile.tempdir = None  # tempfile caches the directory it found first
    yield path
    if old is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old
    tempfile.tempdir = None
