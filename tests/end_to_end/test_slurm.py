"""`sweep run` through the slurm launcher on the project's own single-node SLURM (root; CI runs it)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import SPACES, start_cli, sweep_cli
from tests.slurm_cluster import ONE_CORE

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def slurm_spec(
    tmp_path: Path, name: str, *, trial: dict, max_trials: int, parallel: int, launcher: dict | None = None
) -> Path:
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(
        name=name,
        results_dir=str(tmp_path / "results"),
        launcher={"kind": "slurm", "poll_s": 1.0, "exclusive": False, **(ONE_CORE if launcher is None else launcher)},
    )
    spec["trial"].update(trial)
    spec["search"] = {"max_trials": max_trials, "parallel": parallel, "seed": 0}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_tiny_sweep_through_slurm_one_task_forking_two_ranks(slurm_cluster, tmp_path):
    spec = slurm_spec(tmp_path, "tiny_slurm", trial={"steps": 4, "timeout_min": 5}, max_trials=2, parallel=2)
    r = sweep_cli("run", str(spec), cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:] + slurm_cluster.logs()
    df = pd.read_parquet(tmp_path / "results" / "tiny_slurm" / "trials")
    assert len(df) == 2 and (df.status == "ok").all(), df[["status", "error"]].to_string()
    assert df.job_id.str.fullmatch(r"\d+").all()
    assert df.nodelist.isin(slurm_cluster.nodes).all()
    assert (df.num_devices == 2).all() and df.step_times_s.map(len).eq(4).all()
    assert (df.launcher == "slurm").all()
    # each job ran one task (one result pickle: submitit's `<job>_<task>_result.pkl`), which forked
    # the node's two ranks (their logs in the node's folder)
    for job in (tmp_path / "results" / "tiny_slurm" / "jobs").glob("trial-*-a1"):
        assert [p.name.split("_")[1] for p in (job / "slurm").glob("*_result.pkl")] == ["0"], job
        assert sorted(p.name for p in (job / "node0" / "logs").glob("rank*.log")) == ["rank0.log", "rank1.log"]


def job_processes(job_id: str) -> dict[str, list[int]]:
    """The live processes of a SLURM job, found by the SLURM_JOB_ID in their environment (every node's
    slurmd runs on this host): its tasks (submitit's `python -m submitit.core._submit`, not the `srun`
    that started them) and the zygote each forked its node's ranks from, with those ranks (which keep
    the zygote's command line)."""
    found: dict[str, list[int]] = {"tasks": [], "zygote": []}
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit() or (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            environ, cmdline = (d / "environ").read_bytes(), (d / "cmdline").read_bytes()
        except OSError:
            continue
        argv = cmdline.split(b"\0")
        if f"SLURM_JOB_ID={job_id}\0".encode() not in environ + b"\0":
            continue
        if not Path(argv[0].decode()).name.startswith("python"):
            continue
        if b"submitit.core._submit" in argv:
            found["tasks"].append(int(d.name))
        elif b"sweeper.runtime.zygote" in argv:
            found["zygote"].append(int(d.name))
    return found


@dataclasses.dataclass
class TimeLimited:
    """The time-limit test's sweep while it waits out its limit: the `sweep run`, its two in-flight
    records (the cancelled trial's first), and what went wrong before the wait, if anything."""

    proc: subprocess.Popen[str]
    folder: Path
    records: list[dict]
    problem: str | None = None


TIME_LIMIT_TEST = "test_time_limit_and_scancel_become_rows"


@pytest.fixture(scope="module", autouse=True)
def time_limited(
    request: pytest.FixtureRequest, slurm_cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TimeLimited | None]:
    """Two trials that would run for hours: one cancelled from outside, the other hung (its ranks
    stopped, as a trial stuck in a collective is) until SLURM's time limit ends it. Started before this
    module's first test and left to wait out the limit (SLURM's shortest, a minute, which slurmctld
    checks every 30 s: 60-90 s with nothing to do) while the module's other tests run; the last test,
    `test_time_limit_and_scancel_become_rows`, reads how it ended. Stopped, the hung trial takes no
    CPU (SLURM sends SIGCONT before SIGTERM and SIGKILL, as to any stopped task). Not started where that
    test was not selected."""
    if not any(item.name == TIME_LIMIT_TEST for item in request.session.items):
        yield None
        return
    tmp_path = tmp_path_factory.mktemp("time_limit")
    spec = slurm_spec(tmp_path, "tiny_faults", trial={"steps": 100_000, "timeout_min": 1}, max_trials=2, parallel=2)
    run = TimeLimited(start_cli("run", str(spec), cwd=tmp_path), tmp_path / "results" / "tiny_faults", [])
    try:
        run.problem = _cancel_one_and_stop_the_other(run)
        yield run
    finally:
        if run.proc.poll() is None:  # the test did not wait for it (not run, or failed before)
            run.proc.kill()
            run.proc.communicate()
            ids = [r["job_id"] for r in run.records if r.get("job_id")]
            if ids:
                subprocess.run(["scancel", *ids], check=False)


def _cancel_one_and_stop_the_other(run: TimeLimited) -> str | None:
    """Wait for both trials' jobs, scancel the first once it runs (as an operator would), SIGSTOP the
    other's task and ranks; what went wrong, or None."""
    inflight = run.folder / "inflight"
    deadline = time.time() + 120
    # a record is saved before its job is submitted (job_id null), then again with the job id
    while (
        time.time() < deadline
        and run.proc.poll() is None
        and (len(run.records) < 2 or not all(r.get("job_id") for r in run.records))
    ):
        run.records = (
            [json.loads(p.read_text()) for p in sorted(inflight.glob("trial-*.json"))] if inflight.is_dir() else []
        )
        time.sleep(0.5)
    if len(run.records) != 2 or not all(r.get("job_id") for r in run.records):
        ended = run.proc.poll()
        return f"two trials should be in flight: {ended} {run.proc.stderr.read() if ended is not None else ''}"
    victim = run.records[0]
    deadline = time.time() + 60
    while time.time() < deadline:
        state = subprocess.run(
            ["squeue", "-h", "-j", victim["job_id"], "-o", "%T"], capture_output=True, text=True
        ).stdout
        if "RUNNING" in state:
            break
        time.sleep(0.5)
    subprocess.run(["scancel", victim["job_id"]], check=True)
    hung = run.records[1]["job_id"]
    deadline = time.time() + 120
    # the job's one task, its zygote and the two ranks it forked
    while time.time() < deadline and run.proc.poll() is None:
        procs = job_processes(hung)
        if len(procs["tasks"]) == 1 and len(procs["zygote"]) >= 3:
            break
        time.sleep(0.2)
    else:
        return f"job {hung}: processes {job_processes(hung)}, sweep {run.proc.poll()}"
    for pid in procs["tasks"] + procs["zygote"]:  # the task first: it would end its stopped ranks itself
        os.kill(pid, signal.SIGSTOP)
    return None


def test_external_workload_through_slurm(slurm_cluster, tmp_path):
    standin = Path(__file__).parents[1] / "standins" / "megatron_pretrain.py"
    # the launcher's default cpus_per_task (the node's CPUs over its tasks, from sinfo): a stand-in trains nothing
    spec = slurm_spec(
        tmp_path, "mega_slurm", trial={"steps": 4, "timeout_min": 5}, max_trials=2, parallel=2, launcher={}
    )
    data = yaml.safe_load(spec.read_text())
    data["workload"] = {"kind": "megatron", "command": f"{sys.executable} {standin} --node {{node_rank}} {{flags}}"}
    spec.write_text(yaml.safe_dump(data))
    r = sweep_cli("run", str(spec), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:] + slurm_cluster.logs()
    df = pd.read_parquet(tmp_path / "results" / "mega_slurm" / "trials")
    assert len(df) == 2 and (df.status == "ok").all(), df[["status", "error"]].to_string()
    assert (df.device == "megatron workload").all() and df.job_id.str.fullmatch(r"\d+").all()


def test_time_limit_and_scancel_become_rows(time_limited: TimeLimited | None) -> None:
    # the module's fixture started the two trials, cancelled one and stopped the other before the
    # tests above ran: the sweep ends with one row each and no hang
    assert time_limited is not None
    run = time_limited
    assert run.problem is None, run.problem
    out, err = run.proc.communicate(timeout=400)
    assert run.proc.returncode == 1, err[-3000:]  # both trials failed: `sweep run` says no trial succeeded
    victim = run.records[0]
    df = pd.read_parquet(run.folder / "trials").set_index("trial_number")
    cancelled = df.loc[victim["trial_number"]]
    assert cancelled.status == "failed" and "cancelled" in cancelled.error, cancelled.error
    other = df.drop(index=victim["trial_number"]).iloc[0]
    assert other.status == "timeout", other.error
    assert not list((run.folder / "inflight").iterdir())
    # nothing of the sweep still pending or running (a job that just hit its limit may linger a
    # few seconds in SLURM's COMPLETING state, which is SLURM's epilog, not a leftover)
    left = subprocess.run(
        ["squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%A"], capture_output=True, text=True
    ).stdout.split()
    assert not set(left) & {r["job_id"] for r in run.records}
