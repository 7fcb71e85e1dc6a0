"""End-to-end checks of the project's local SLURM cluster through submitit.

They check what the sweep's `slurm` launcher relies on: a job of 2 tasks runs and both ranks
report back; a job that runs past its time limit ends as TIMEOUT and a job cancelled with
`scancel` as CANCELLED, each seen by submitit (through sacct) and raised as
`UncompletedJobError` instead of hanging. About 100 s, most of it the 1-minute time limit.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import submitit
from submitit.core.utils import UncompletedJobError

from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm


def _executor(cluster: SlurmCluster, folder: Path, **params: Any) -> submitit.AutoExecutor:
    # a fresh folder per test: job ids restart at 1 with each fresh cluster, and a reused
    # folder/%j would hand a new job the result file of an old one
    assert not folder.exists()
    executor = submitit.AutoExecutor(folder=folder)
    assert executor.cluster == "slurm"  # submitit found sbatch and chose SLURM by itself
    # submitit's default asks SLURM for USR2 90 s before the limit, and a task that has not yet
    # installed submitit's handler dies of it ("User defined signal 2"): on a loaded CI machine
    # a 2-minute job got it before its Python had started. Like the launcher, send no signal.
    executor.update_parameters(
        nodes=1, cpus_per_task=1, slurm_partition=cluster.partition, slurm_signal_delay_s=0, **params
    )
    return executor


def _sacct(job_id: str, *fields: str) -> dict[str, str]:
    """The job's allocation line in sacct (accounting), as {field: value}."""
    out = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", ",".join(fields)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    assert out, f"sacct knows no job {job_id}"
    return dict(zip(fields, out.splitlines()[0].split("|")))


def _wait_until(what: str, predicate: Any, timeout_s: float, job: submitit.Job[Any]) -> float:
    """Poll `predicate()` every 0.5 s; return the seconds it took. (submitit's own wait polls
    sacct ever more rarely: 2, 4, 8 ... 64, 128 s after submission.)"""
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > timeout_s:
            try:
                stderr = job.stderr()
            except Exception as e:  # noqa: BLE001 - the message must not hide the timeout
                stderr = repr(e)
            raise AssertionError(
                f"job {job.job_id}: not {what} after {timeout_s}s (state {job.state});\nstderr:\n{stderr}"
            )
        time.sleep(0.5)
    return time.monotonic() - t0


def _no_result_wait(job: submitit.Job[Any]) -> None:
    """A job that SLURM ended has no result file: job.result() waits 15 s for one (in case of
    a slow shared filesystem) before it raises. Our folder is local: 1 s is plenty."""
    job._results_timeout_s = 1  # a class attribute of submitit's Job, shadowed on this job


def _state(job: submitit.Job[Any]) -> str:
    return job.watcher.get_state(job.job_id, mode="force")


def test_two_task_job_round_trip(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    def report() -> dict[str, Any]:
        import os
        import socket

        import submitit

        env = submitit.JobEnvironment()
        return {
            "global_rank": env.global_rank,
            "local_rank": env.local_rank,
            "num_tasks": env.num_tasks,
            "num_nodes": env.num_nodes,
            "job_id": env.job_id,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
        }

    executor = _executor(slurm_cluster, tmp_path / "submitit", tasks_per_node=2, timeout_min=5)
    job = executor.submit(report)
    results = job.results()  # one per task, in task order

    assert [r["global_rank"] for r in results] == [0, 1]
    assert [r["local_rank"] for r in results] == [0, 1]
    for r in results:
        assert (r["num_tasks"], r["num_nodes"], r["job_id"]) == (2, 1, job.job_id)
        assert r["hostname"].split(".")[0] == slurm_cluster.host  # every node's slurmd runs here
    assert results[0]["pid"] != results[1]["pid"]  # two processes, not one called twice

    # the accounting record (what submitit reads) ends COMPLETED, with 2 CPUs on our partition.
    # It is written in several messages: a job this short can show COMPLETED a moment before
    # its Partition is filled in, so wait for the whole record.
    expected = {
        "State": "COMPLETED",
        "AllocCPUS": "2",
        "NNodes": "1",
        "Partition": slurm_cluster.partition,
    }
    fields = tuple(expected)
    _wait_until(f"{expected} in sacct", lambda: _sacct(job.job_id, *fields) == expected, 30, job)
    assert _sacct(job.job_id, "NodeList")["NodeList"] in slurm_cluster.nodes
    assert job.watcher.get_state(job.job_id, mode="force") == "COMPLETED"


def test_job_cancelled_with_scancel_ends_as_cancelled(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    executor = _executor(slurm_cluster, tmp_path / "submitit", tasks_per_node=1, timeout_min=5)
    job = executor.submit(time.sleep, 600)
    _wait_until("RUNNING", lambda: _state(job) == "RUNNING", 30, job)

    subprocess.run(["scancel", job.job_id], check=True, timeout=30)  # the real command
    took = _wait_until("done", lambda: job.done(force_check=True), 30, job)

    # sacct says who cancelled it: "CANCELLED by <uid>"
    assert job.state == f"CANCELLED by {os.getuid()}", took
    _no_result_wait(job)
    with pytest.raises(UncompletedJobError) as raised:
        job.result()
    assert f"has not produced any output (state: CANCELLED by {os.getuid()})" in str(raised.value)
    assert _sacct(job.job_id, "State")["State"] == f"CANCELLED by {os.getuid()}"
