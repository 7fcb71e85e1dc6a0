"""files: atomic writes replace a file whole or not at all."""

from __future__ import annotations

import pytest

from sweeper.files import atomic_write, atomic_write_text


def test_atomic_write_replaces_whole_and_leaves_nothing_on_failure(tmp_path):
    path = tmp_path / "f.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"

    def half_then_fail(tmp):
        tmp.write_text("partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
