"""Issue 48: rows checked against their sweep. A row file edited to a layout outside the sweep's
space, or to an MFU outside its own interval, is skipped (or read as failed) with a warning by every
command: never ranked, exported or plotted. The real CLI on the 4-layout replay sweep."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.faults.helpers import sweep
from tests.faults.test_row_checks import a_row, planted


def _edit_trial_0(trials: Path, **changes) -> Path:
    """Trial 0's own file rewritten with `changes`, private as the tool leaves it."""
    row = a_row(trials, **changes)
    path = trials / "trial-00000.parquet"
    path.unlink()
    return planted(trials, path.name, [row])


def test_a_row_edited_outside_the_space_is_skipped_by_every_command(ran_ex: Path, tmp_path: Path):
    trials = tmp_path / "results" / "ex" / "trials"
    path = _edit_trial_0(trials, tp=1_000_000, mfu=0.9)
    warning = f"skipped {path}: tp 1000000 is not in the sweep's space (tp: 1, 2)"
    for cmd in (("best", "--format", "torchtitan"), ("best",), ("status",), ("report",), ("run",)):
        r = sweep(cmd[0], str(ran_ex), *cmd[1:], cwd=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (cmd, r.stderr[-1500:])
        assert warning in " ".join(r.stderr.split()), (cmd, r.stderr)
        assert "1000000" not in r.stdout, (cmd, r.stdout)
    # the best of what is left: tp=2 pp=2, MFU 0.6 (trial 0's row is not rerun over the edited file)
    r = sweep("best", str(ran_ex), "--format", "json", cwd=tmp_path)
    assert '"tensor_parallel": 2' in r.stdout or '"tp": 2' in r.stdout, r.stdout
    assert pq.read_table(path).to_pylist()[0]["tp"] == 1_000_000


@pytest.mark.parametrize(("low", "high"), [(0.5, 0.6), (0.95, 0.97)])
def test_an_mfu_outside_its_own_interval_is_read_as_failed(ran_ex: Path, tmp_path: Path, low: float, high: float):
    trials = tmp_path / "results" / "ex" / "trials"
    path = _edit_trial_0(trials, mfu=0.9, mfu_low=low, mfu_high=high)
    side = "above its own interval's high end" if high < 0.9 else "below its own interval's low end"
    for cmd in ("best", "status", "report"):
        r = sweep(cmd, str(ran_ex), cwd=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (cmd, r.stderr[-1500:])
        assert f"read {path} as failed: impossible numbers: mfu is 0.9, {side}" in " ".join(r.stderr.split())
    r = sweep("best", str(ran_ex), cwd=tmp_path)
    assert "90.00%" not in r.stdout and "60.00%" in r.stdout, r.stdout  # tp=2 pp=2 ranks first
    assert (tmp_path / "results" / "ex" / "report.html").is_file()  # the report was written, plots and all
