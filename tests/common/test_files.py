"""files: atomic writes replace a file whole or not at all."""

from __future__ import annotations

import os

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


@pytest.mark.parametrize(("umask", "shared"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_a_file_for_the_user_takes_the_umask_and_a_results_file_stays_private(tmp_path, umask, shared):
    old = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "plan.csv", "a,b\n", private=False)
        atomic_write_text(tmp_path / "row.json", "{}")
        assert os.umask(umask) == umask  # reading the mask left it as it was
    finally:
        os.umask(old)
    assert (tmp_path / "plan.csv").stat().st_mode & 0o777 == shared
    assert (tmp_path / "row.json").stat().st_mode & 0o777 == 0o600


def test_the_report_page_has_the_mode_of_its_pictures(tmp_path):
    from tests.report.test_page import run_report, write_results

    spec = write_results(tmp_path)
    old = os.umask(0o022)
    try:
        r = run_report(spec)
    finally:
        os.umask(old)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "results" / "r"
    modes = {p.name: p.stat().st_mode & 0o777 for p in [out / "report.html", *out.glob("*.png")]}
    assert len(modes) > 2 and set(modes.values()) == {0o644}, modes
