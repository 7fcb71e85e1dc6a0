"""`sweep run` through the torchx launcher on the session's real local Ray head (tests/ray_cluster.py):
the demo sweep end to end, then `sweep best`; and a `sweep run` killed mid-trial that re-attaches to
its Ray app instead of submitting the trial again."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from tests.conftest import SPACES, start_cli, sweep_cli

pytestmark = [pytest.mark.ray, pytest.mark.slow]
STANDIN = Path(__file__).parents[1] / "standins" / "megatron_pretrain.py"


def ray_spec(tmp_path: Path, ray_head: Any, name: str, *, trial: dict[str, Any], max_trials: int) -> Path:
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(name=name, results_dir=str(tmp_path / "results"))
    # python: this test's own (the head's workers do not have the virtual environment on their PATH)
    spec["launcher"] = {
        "kind": "torchx",
        "scheduler": "ray",
        "python": sys.executable,
        "poll_s": 0.5,
        "cfg": {"dashboard_address": ray_head.dashboard},
    }
    spec["trial"].update(trial)
    spec["search"] = {"max_trials": max_trials, "parallel": 1, "seed": 0}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_the_demo_sweep_through_ray_then_best(ray_head: Any, tmp_path: Path) -> None:
    spec = ray_spec(tmp_path, ray_head, "tiny_ray", trial={"steps": 4}, max_trials=2)
    run = sweep_cli("run", str(spec), cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    folder = tmp_path / "results" / "tiny_ray"
    df = pd.read_parquet(folder / "trials")
    assert len(df) == 2 and (df.status == "ok").all(), df[["status", "error"]].to_string()
    assert (df.launcher == "torchx").all()
    # the app handle is the job id: scheduler, Ray's dashboard, the app's unique name
    assert df.job_id.str.startswith(f"ray://torchx/{ray_head.dashboard}-sweep-tiny-ray-").all(), df.job_id.tolist()
    assert (df.num_devices == 2).all() and df.step_times_s.map(len).eq(4).all() and (df.mfu > 0).all()
    logs = sorted(folder.glob("jobs/*/logs/trial-0.log"))
    assert len(logs) == 2 and all("SWEEP_REPLICA" in p.read_text() for p in logs)  # fetched into each trial's folder
    best = sweep_cli("best", str(spec), cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    first = re.search(r"│ 1 │\s+(\d+) │", best.stdout)  # the table's first row: its trial number
    assert first and int(first[1]) == df.loc[df.mfu.idxmax()].trial_number, best.stdout


def test_a_killed_sweep_reattaches_to_its_running_ray_app(ray_head: Any, tmp_path: Path) -> None:
    # a trial of ~8 s (400 steps of the Megatron stand-in); `sweep run` is killed while it runs, and the
    # next `sweep run` collects that same app's result instead of submitting the trial again
    spec = ray_spec(tmp_path, ray_head, "tiny_ray_kill", trial={"steps": 400, "timeout_min": 5}, max_trials=1)
    data = yaml.safe_load(spec.read_text())
    data["workload"] = {"kind": "megatron", "command": f"{sys.executable} {STANDIN} {{flags}}"}
    spec.write_text(yaml.safe_dump(data))
    folder = tmp_path / "results" / "tiny_ray_kill"
    proc = start_cli("run", str(spec), cwd=tmp_path)
    record: dict[str, Any] = {}
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and not record.get("job_id"):
        found = sorted((folder / "inflight").glob("trial-*.json")) if (folder / "inflight").is_dir() else []
        record = json.loads(found[0].read_text()) if found else {}
        time.sleep(0.2)
    assert record.get("job_id"), f"no trial in flight: {proc.poll()}"
    os.kill(proc.pid, signal.SIGKILL)  # `sweep run` dies: nothing of it is left to collect the app
    proc.wait()
    again = sweep_cli("run", str(spec), cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    df = pd.read_parquet(folder / "trials")
    assert len(df) == 1 and df.status.iloc[0] == "ok", df[["status", "error"]].to_string()
    assert df.job_id.iloc[0] == record["job_id"]  # the same app, re-attached
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(f"http://{ray_head.dashboard}").list_jobs()
    ours = [j for j in jobs if (j.submission_id or "").startswith("sweep-tiny-ray-kill-")]
    assert len(ours) == 1, [j.submission_id for j in ours]  # submitted once


def test_two_slots_are_kept_full_with_an_app_each(ray_head: Any, tmp_path: Path) -> None:
    # the Megatron stand-in (one replica, 1 CPU of the head's 2): two apps run at once, and each
    # ended one's slot is refilled until the budget is spent
    spec = ray_spec(tmp_path, ray_head, "ray_slots", trial={"steps": 100, "timeout_min": 5}, max_trials=4)
    data = yaml.safe_load(spec.read_text())
    data["workload"] = {"kind": "megatron", "command": f"{sys.executable} {STANDIN} {{flags}}"}
    data["launcher"]["cpus_per_replica"] = 1
    data["search"]["parallel"] = 2
    spec.write_text(yaml.safe_dump(data))
    folder = tmp_path / "results" / "ray_slots"
    proc = start_cli("run", str(spec), cwd=tmp_path)
    most = 0
    while proc.poll() is None:
        flying = list((folder / "inflight").glob("trial-*.json")) if (folder / "inflight").is_dir() else []
        most = max(most, sum(1 for p in flying if json.loads(p.read_text()).get("job_id")))
        time.sleep(0.1)
    assert proc.returncode == 0, proc.stderr.read()[-3000:] if proc.stderr else ""
    df = pd.read_parquet(folder / "trials")
    assert len(df) == 4 and (df.status == "ok").all(), df[["status", "error"]].to_string()
    assert df.job_id.nunique() == 4 and most == 2  # two apps in flight at once, never more
