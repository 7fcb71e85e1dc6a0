"""`sweep run` on the local multi-node SLURM (three slurmd node names on this host, root; CI runs it):
a node set DOWN under a running trial, `sweep run` SIGKILLed while its job runs, an OOM trial."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from sweeper.launchers.task import rank0_result
from tests.conftest import SPACES, cli_env, start_cli, sweep_cli
from tests.slurm_cluster import ONE_CORE

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def spec_file(tmp_path: Path, name: str, *, steps: int = 4, **launcher: Any) -> Path:
    """One trial of the tiny CPU sweep (one node of 2 ranks, tp=1 pp=1) through the slurm launcher."""
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(
        name=name,
        results_dir=str(tmp_path / "results"),
        launcher={"kind": "slurm", "poll_s": 0.5, "exclusive": False, **ONE_CORE, **launcher},
    )
    spec["space"] = {"tp": [1], "pp": [1], "micro_batch_size": [1], "attention": ["sdpa_math"]}
    spec["trial"].update(steps=steps, timeout_min=5)
    spec["search"] = {"max_trials": 1, "parallel": 1, "seed": 0}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start_run(spec: Path, cwd: Path, **env: str) -> subprocess.Popen[str]:
    return start_cli("run", str(spec), cwd=cwd, env=cli_env(**env))


def running_job(results: Path, proc: subprocess.Popen[str], timeout_s: float = 120) -> dict[str, Any]:
    """The in-flight record of the sweep's trial once its SLURM job is RUNNING, with its node."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        assert proc.poll() is None, f"sweep run ended early: {proc.communicate()[1][-2000:]}"
        records = (
            [json.loads(p.read_text()) for p in sorted((results / "inflight").glob("trial-*.json"))]
            if (results / "inflight").is_dir()
            else []
        )
        if records and records[0].get("job_id"):  # a record is saved before its job is submitted (job_id null)
            out = subprocess.run(
                ["squeue", "-h", "-j", records[0]["job_id"], "-o", "%T|%N"], capture_output=True, text=True
            ).stdout.strip()
            if out.startswith("RUNNING|") and out.split("|")[1]:
                return records[0] | {"node": out.split("|")[1]}
        time.sleep(0.2)
    raise AssertionError("the trial's SLURM job did not start running")


def rows(results: Path) -> pd.DataFrame:
    return pd.read_parquet(results / "trials")


def test_node_failure_is_retried_without_the_failed_node(slurm_cluster, tmp_path):
    assert len(slurm_cluster.nodes) >= 2, "needs a multi-node local SLURM (SWEEP_TEST_SLURM_NODES)"
    spec = spec_file(tmp_path, "nodefail")
    results = tmp_path / "results" / "nodefail"
    proc = start_run(spec, tmp_path)
    first = running_job(results, proc)
    node = first["node"]
    try:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=down", "reason=sweep-test"], check=True)
        _, err = proc.communicate(timeout=400)
    finally:
        # ReturnToService=2 brings it back when its slurmd registers; make sure of it
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], capture_output=True)
    assert proc.returncode == 0, err[-3000:] + slurm_cluster.logs()
    acct = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", first["job_id"], "-o", "State,NodeList"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert acct[0] == f"NODE_FAIL|{node}", acct
    df = rows(results)
    assert len(df) == 1, df[["status", "error"]].to_string()
    row = df.iloc[0]
    assert row.status == "ok" and row.attempt == 2, row.error
    assert row.job_id != first["job_id"] and row.nodelist != node
    # the retry was submitted with the failed node excluded (submitit's sbatch script)
    script = next((results / "jobs" / "trial-00000-a2" / "slurm").glob("*_submission.sh")).read_text()
    assert f"#SBATCH --exclude={node}" in script, script


def test_reattach_after_sweep_run_is_killed_while_the_job_runs(slurm_cluster, tmp_path):
    spec = spec_file(tmp_path, "reattach", steps=30)
    results = tmp_path / "results" / "reattach"
    since = time.strftime("%Y-%m-%dT%H:%M:%S")  # sacct keeps jobs of earlier sessions of a kept cluster
    proc = start_run(spec, tmp_path)
    first = running_job(results, proc)
    proc.send_signal(signal.SIGKILL)  # no cleanup at all: the job keeps running under SLURM
    proc.communicate(timeout=30)
    state = subprocess.run(["squeue", "-h", "-j", first["job_id"], "-o", "%T"], capture_output=True, text=True).stdout
    assert state.strip() in ("RUNNING", "COMPLETING", ""), state
    again = sweep_cli("run", str(spec), cwd=tmp_path, timeout=400)
    assert again.returncode == 0, again.stderr[-3000:]
    df = rows(results)
    assert len(df) == 1 and df.status.iloc[0] == "ok", df[["status", "error"]].to_string()
    assert df.job_id.iloc[0] == first["job_id"] and df.attempt.iloc[0] == 1  # the same job, not a rerun
    assert not list((results / "inflight").iterdir())
    jobs = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-S", since, "--name", "sweep-reattach-0", "-o", "JobID"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert jobs == [first["job_id"]], jobs


def test_oom_on_slurm_is_an_oom_row(slurm_cluster, tmp_path):
    # injected as tests/faults do: rank 1 raises torch.OutOfMemoryError at step 1 (sbatch
    # passes the submitting environment into the job)
    spec = spec_file(tmp_path, "oomslurm")
    r = sweep_cli("run", str(spec), cwd=tmp_path, timeout=400, env=cli_env(SWEEP_FAULT="oom:1:1"))
    assert r.returncode == 1, r.stderr[-3000:]  # no trial succeeded: the sweep says so with exit 1
    df = rows(tmp_path / "results" / "oomslurm")
    assert len(df) == 1, df.to_string()
    row = df.iloc[0]
    assert row.status == "oom" and "rank 1" in row.error and "out of memory" in row.error, row.error
    assert row.launcher == "slurm" and row.nodelist in slurm_cluster.nodes and row.attempt == 1


def test_job_still_running_after_its_result_is_cancelled(slurm_cluster, tmp_path):
    # rank 1 hangs after the outcome is written (as a task stuck in NCCL teardown would):
    # the job is cancelled the profile's result_grace_s after the result, long before its
    # 5-minute limit (60 s by default, tests/launchers/test_slurm.py; 10 s here, to keep the suite short)
    grace = 10.0
    spec = spec_file(tmp_path, "linger", result_grace_s=grace)
    start = time.monotonic()
    r = sweep_cli("run", str(spec), cwd=tmp_path, timeout=400, env=cli_env(SWEEP_FAULT="linger:1:0"))
    elapsed = time.monotonic() - start
    assert r.returncode == 0, r.stderr[-3000:]
    row = rows(tmp_path / "results" / "linger").iloc[0]
    assert row.status == "ok", row.error
    assert grace <= elapsed < 240, elapsed
    state = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", row.job_id, "-o", "State"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert state and state[0].startswith("CANCELLED"), state
    # the grace was waited out: the job ended no sooner than `grace` after rank 0 wrote the result
    # (sacct's End has whole seconds)
    end = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", row.job_id, "-o", "End"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    written = rank0_result(tmp_path / "results" / "linger" / "jobs" / "trial-00000-a1").stat().st_mtime
    assert grace - 1 <= datetime.fromisoformat(end).timestamp() - written < grace + 60, (end, written)
