"""Faults inside a trial on the local launcher, through a real `sweep run`: an OOM on one rank,
a rank that hangs (SIGSTOP), a trial process SIGKILLed. Each ends as one row with its status,
the retry policy applied, the Optuna study told, and no process left behind."""

from __future__ import annotations

import json
import signal
import time

import pytest

from tests.faults.helpers import (
    alive,
    assert_no_processes_left,
    assert_rows_match_study,
    env_with,
    kill,
    rank_pids,
    results,
    spec_file,
    start,
    sweep,
    wait_for,
)

pytestmark = pytest.mark.slow


def inflight_record(root, number: int = 0) -> dict | None:
    path = root / "inflight" / f"trial-{number:05d}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def test_oom_on_one_rank_is_oom_not_retried_and_the_sweep_goes_on(tmp_path):
    spec = spec_file(tmp_path, "oom", search={"max_trials": 2})
    r = sweep("run", str(spec), cwd=tmp_path, env=env_with(SWEEP_FAULT="oom:1:1"))  # through sweep run's env
    assert r.returncode == 1, r.stderr[-3000:]  # the sweep ran to its end; 1: no trial succeeded
    df = assert_rows_match_study(tmp_path, "oom")
    assert sorted(df.trial_number) == [0, 1]  # the first OOM did not stop the sweep
    assert (df.status == "oom").all(), df[["status", "error"]]
    assert df.error.str.contains("rank 1").all() and df.error.str.contains("out of memory").all()
    assert (df.attempt == 1).all() and df.mfu.isna().all()  # no retry for an OOM; nothing measured is null
    jobs = sorted(p.name for p in (results(tmp_path, "oom") / "jobs").iterdir())
    assert jobs == ["trial-00000-a1", "trial-00001-a1"]
    assert_no_processes_left(results(tmp_path, "oom"))


def test_a_stopped_rank_ends_as_timeout_and_no_rank_survives(tmp_path):
    # 30 steps take ~8 s; the 12 s limit is hit only because rank 1 is stopped (forked by the zygote,
    # the ranks start with torch imported: 3 steps were over before the stop)
    spec = spec_file(
        tmp_path,
        "hang",
        trial={"timeout_min": 12 / 60, "steps": 30},
        search={"max_trials": 1},
        space={"tp": [1], "pp": [2], "micro_batch_size": [1], "attention": ["flash2"]},
    )
    root = results(tmp_path, "hang")
    proc = start("run", str(spec), cwd=tmp_path)
    try:
        trial_dir = root / "jobs" / "trial-00000-a1"
        pids = wait_for(lambda: (p := rank_pids(trial_dir)) and len(p) == 2 and p, timeout=60, what="two ranks")
        time.sleep(0.5)
        kill(pids[1], signal.SIGSTOP)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, err[-3000:]  # its only trial timed out: no trial succeeded
    df = assert_rows_match_study(tmp_path, "hang")
    row = df.iloc[0]
    assert row.status == "timeout", row.error
    assert "wall-clock limit" in row.error and row.attempt == 1
    assert not any(alive(p) for p in pids), "a rank process survived its trial"
    assert_no_processes_left(root)


def test_trial_process_killed_is_retried_once_then_failed_with_the_cause(tmp_path):
    # 40 steps: the ranks are killed as they start (importing torch takes seconds), so they are
    # alive when their trial dies; the second trial, left to run, takes ~12 s here (200 took a minute)
    spec = spec_file(tmp_path, "killed", trial={"steps": 40}, search={"max_trials": 2})
    root = results(tmp_path, "killed")
    proc = start("run", str(spec), cwd=tmp_path)
    try:
        for attempt in (1, 2):  # kill the trial's own process (not a rank) on both attempts
            rec = wait_for(
                lambda a=attempt: (r := inflight_record(root)) and r["attempt"] == a and r.get("job_id") and r,
                timeout=60,
                what=f"attempt {attempt} in flight",
            )
            trial_dir = root / "jobs" / f"trial-00000-a{attempt}"
            ranks = wait_for(
                lambda d=trial_dir: (p := rank_pids(d)) and len(p) == 2 and p, timeout=60, what="two ranks"
            )
            assert all(alive(p) for p in ranks), "the ranks ended before their trial was killed"
            kill(int(rec["job_id"].removeprefix("local-")))
            wait_for(lambda r=ranks: not any(alive(p) for p in r), timeout=10, what="ranks to end with their trial")
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    df = assert_rows_match_study(tmp_path, "killed").set_index("trial_number")
    first = df.loc[0]
    assert first.status == "failed" and first.attempt == 2
    assert "killed by SIGKILL" in first.error and "(attempt 1: " in first.error, first.error
    assert df.loc[1].status == "ok" and df.loc[1].attempt == 1  # the sweep went on
    assert_no_processes_left(root)
