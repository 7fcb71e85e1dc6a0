"""Issue 27, 9 and the smaller faults of the results folder: rows of a wrong schema, two rows of one
trial, a row file others could write or another user owns, a temp file a kill left behind, the
recorded sweep file edited while the sweep runs, and what a rerun after a full disk says.

The real CLI on a replay sweep (no processes), but for the full disk's rerun (a real local trial)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from sweeper.plan.plan import make_plan
from sweeper.results.rows import ResultsStore
from sweeper.spec.loader import load_sweep
from tests.conftest import ROOT, SPACES
from tests.faults.helpers import sweep, sweep_placed
from tests.faults.test_hardening import one_line_error, replay_spec

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="handing a file to another user needs root")


def planted(trials: Path, name: str, rows: list[dict]) -> Path:
    """A Parquet file in trials/ holding `rows` (types as pyarrow infers them), private like the tool's own."""
    path = trials / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    os.chmod(path, 0o600)
    return path


def a_row(trials: Path, **changes) -> dict:
    """Trial 0's row with `changes`, as a stranger's edit of it would read."""
    return pq.read_table(trials / "trial-00000.parquet").to_pylist()[0] | changes


# ---- 9: rows of a wrong schema ---------------------------------------------------------
def test_malformed_rows_are_one_warning_each_in_every_command_never_a_traceback(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    trials = tmp_path / "results" / "ex" / "trials"
    bad = {
        planted(trials, "trial-00006.parquet", [a_row(trials, trial_number="six")]): "field 'trial_number' is string",
        planted(
            trials, "trial-00007.parquet", [a_row(trials, trial_number=7, status="weird")]
        ): "field 'status' is 'weird'",
        planted(trials, "trial-00008.parquet", [a_row(trials, trial_number=8)] * 2): "it holds 2 rows",
        planted(
            trials, "trial-00009.parquet", [a_row(trials, trial_number=2)]
        ): "field 'trial_number' is 2, its file name trial 9's",
        planted(trials, "trial-00010.parquet", [a_row(trials, trial_number=10, mfu="high")]): "field 'mfu' is string",
    }
    second = trials / "trial-000003.parquet"  # another spelling of trial 3's file
    shutil.copy(trials / "trial-00003.parquet", second)
    bad[second] = "a second file of trial 3 (trial-00003.parquet is read)"
    more = replay_spec(tmp_path, search={"max_trials": 4, "parallel": 1})
    for cmd in (("run", str(more)), ("status", str(spec)), ("best", str(spec)), ("report", str(spec))):
        r = sweep(*cmd, cwd=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (cmd, r.stderr[-3000:])
        warnings = [ln for ln in r.stderr.splitlines() if "warning:" in ln]
        for path, why in bad.items():
            assert sum(f"{path}: {why}" in ln for ln in warnings) == 1, (cmd, path, why, r.stderr)
        if cmd[0] == "status":
            assert "ex: 4 finished, 0 running" in r.stdout, r.stdout
    assert sorted(p.name for p in trials.glob("trial-0000?.parquet"))[:4] == [
        f"trial-0000{n}.parquet" for n in range(4)
    ]
    assert not (trials / "trial-00011.parquet").exists()  # nothing ran: the 4 good rows are the budget


# ---- trust: a row file others could write, or another user owns -------------------------
@pytest.mark.parametrize("owner", ["world-writable", "another-user"])
def test_a_row_file_others_could_have_written_is_refused_by_run(ran_ex: Path, tmp_path: Path, owner: str):
    spec = ran_ex
    row = tmp_path / "results" / "ex" / "trials" / "trial-00002.parquet"
    if owner == "world-writable":
        os.chmod(row, 0o666)
        words = f"{row}: writable by others (mode 666)"
    else:
        if os.geteuid() != 0:
            pytest.skip("handing a file to another user needs root")
        os.chown(row, 4242, 4242)
        words = f"{row}: owned by user 4242, not you"
    before = sorted(os.listdir(row.parent))
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert words in msg and "trusted like code" in msg, msg
    assert sorted(os.listdir(row.parent)) == before


# ---- a temp file a kill left in .tmp/ ----------------------------------------------------
def test_temp_files_of_a_killed_writer_are_removed_by_the_next_run(tmp_path: Path):
    spec = replay_spec(tmp_path)
    root = tmp_path / "results" / "ex"
    write = "pyarrow.parquet:write_table"  # trial 0's row, into .tmp/ before it is renamed into trials/
    killed = sweep_placed(write, "run", str(spec), call=1, action="kill-after", cwd=tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    left = [p.name for p in (root / ".tmp").iterdir()]
    assert len(left) == 1 and left[0].startswith(".trial-00000.parquet.") and left[0].endswith(".tmp"), left
    live = root / ".tmp" / f".trial-00009.parquet.{os.getpid()}.tmp"  # a writer still at work: left alone
    live.write_bytes(b"")
    r = sweep("run", str(spec), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "removed 1 temp file(s) that a killed writer left" in " ".join(r.stderr.split()), r.stderr
    assert sorted(p.name for p in (root / ".tmp").iterdir()) == [live.name]
    assert len(list((root / "trials").glob("*.parquet"))) == 4


# ---- 10: the recorded sweep file edited while the sweep runs -----------------------------
def _run_editing_the_recorded_file(tmp_path: Path, spec: Path, new_text: str) -> subprocess.CompletedProcess[str]:
    """`sweep run` whose recorded sweep.yaml (`p`) is rewritten to `new_text` before the third in-flight record."""
    recorded = tmp_path / "results" / "ex" / "sweep.yaml"
    edit = f"import pathlib; p = pathlib.Path({str(recorded)!r}); p.write_text({new_text})"
    return sweep_placed(
        "sweeper.results.rows:ResultsStore.record_inflight",
        "run",
        str(spec),
        call=3,
        action="exec-before",
        code=edit,
        cwd=tmp_path,
    )


def test_the_recorded_sweep_file_edited_during_a_run_stops_it_keeping_what_finished(tmp_path: Path):
    spec, recorded = replay_spec(tmp_path), tmp_path / "results" / "ex" / "sweep.yaml"
    r = _run_editing_the_recorded_file(tmp_path, spec, "p.read_text().replace('seq_len: 4096', 'seq_len: 2048')")
    msg = one_line_error(r)
    assert f"{recorded} changed while the sweep ran" in msg and f"cp {spec} {recorded}" in msg, msg
    df = pd.read_parquet(tmp_path / "results" / "ex" / "trials")
    assert len(df) == 2 and df.sweep_id.nunique() == 1, df  # trials 0 and 1 kept; none of the edited sweep
    shutil.copy(spec, recorded)  # the way out it names
    r = sweep("run", str(spec), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(pd.read_parquet(tmp_path / "results" / "ex" / "trials")) == 4


def test_an_edit_that_changes_nothing_measured_goes_on(tmp_path: Path):
    spec = replay_spec(tmp_path)
    r = _run_editing_the_recorded_file(tmp_path, spec, "p.read_text() + '# a note\\n'")
    assert r.returncode == 0, r.stderr
    assert len(pd.read_parquet(tmp_path / "results" / "ex" / "trials")) == 4


# ---- a rerun after a full disk says so, not "vanished" -----------------------------------
@pytest.mark.slow
def test_a_trial_rerun_after_a_full_disk_says_the_disk_was_full_not_vanished(tmp_path: Path):
    """The state a full disk under the whole results folder leaves (neither result nor row written,
    the in-flight record kept, the trial's log ending on ENOSPC); space returns, `sweep run` runs it
    again, and this time the layout really fails: its row names what ended attempt 1."""
    spec = yaml.safe_load((SPACES / "llama13b_2k.yaml").read_text())
    standin = ROOT / "tests" / "standins" / "megatron_pretrain.py"
    spec.update(
        name="df",
        results_dir=str(tmp_path / "results"),
        launcher="local",
        workload={
            "kind": "megatron",
            "command": f"{sys.executable} {standin} {{flags}}",
            "env": {"STANDIN_FAIL": "oom"},
        },
        space={"tp": [2], "pp": [1], "micro_batch_size": [1]},
        cluster={"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": 1000, "peak_tflops": 312}},
        search={"max_trials": 1, "parallel": 1},
    )
    spec["trial"].update(steps=3)
    path = tmp_path / "df.yaml"
    path.write_text(yaml.safe_dump(spec))
    store = ResultsStore(tmp_path / "results" / "df")
    store.ensure()
    shutil.copy(path, store.root / "sweep.yaml")
    plan = make_plan(load_sweep(path))
    row = int(plan.candidate_mask.nonzero()[0][0])
    a1 = store.jobs_dir / "trial-00000-a1"
    a1.mkdir()
    (a1 / "log.txt").write_text("step 1\nOSError: [Errno 28] No space left on device\n")
    stamp = "2026-01-01T00:00:00+00:00"
    record = {"trial_number": 0, "optuna_trial": 0, "row": row, "attempt": 1, "job_id": "local-999999999"}
    store.record_inflight(
        0, record | {"layout": plan.layout(row).as_dict(), "submitted_at": stamp, "started_at": stamp}
    )
    time.sleep(0.01)
    r = sweep("run", str(path), cwd=tmp_path)
    assert r.returncode == 1, r.stderr  # no trial succeeded
    df = pd.read_parquet(store.trials_dir)
    assert df.status.tolist() == ["oom"] and df.attempt.tolist() == [2], df
    error = df.error[0]
    assert "(attempt 1: job local-999999999 could not write its result: the disk was full" in error, error
    assert "vanished" not in error, error


# ---- a row file that would hang or flood the reader ----------------------------------------
def test_a_fifo_or_a_decompression_bomb_in_trials_is_skipped_with_one_line(ran_ex: Path, tmp_path: Path):
    trials = tmp_path / "results" / "ex" / "trials"
    fifo = trials / "trial-00006.parquet"
    os.mkfifo(fifo, 0o600)  # opened for reading, it would block until a writer came
    bomb = trials / "trial-00007.parquet"
    row = a_row(trials, trial_number=7, error="x" * (64 << 20))
    pq.write_table(pa.Table.from_pylist([row]), bomb, compression="zstd")
    os.chmod(bomb, 0o600)
    assert bomb.stat().st_size < 1 << 20  # 64 MiB of one letter compresses to almost nothing
    r = sweep("status", str(ran_ex), cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    warnings = [ln for ln in r.stderr.splitlines() if "warning:" in ln]
    assert sum(f"{fifo}: a FIFO; only a regular file is read here" in ln for ln in warnings) == 1, r.stderr
    assert (
        sum(f"{bomb}: " in ln and "bytes once decompressed; at most 16777216 are decoded here" in ln for ln in warnings)
        == 1
    )
    assert "ex: 4 finished, 0 running" in r.stdout, r.stdout
