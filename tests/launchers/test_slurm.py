"""The SLURM launcher without SLURM: its profile's defaults, a trial's job (one task a node, each rank its CPUs).

The jobs themselves run in launchers/test_contract.py, end_to_end/test_slurm.py and
launchers/test_slurm_multinode.py against the session's real SLURM.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeper.launchers import slurm
from sweeper.launchers.base import TrialJob
from sweeper.launchers.slurm import (
    MASTER_PORTS,
    RESULT_GRACE_S,
    SlurmLauncher,
    SlurmProfile,
    export_task_environ,
    master_port_for,
    omp_threads_line,
)
from sweeper.launchers.task import node_rank
from sweeper.layouts.layout import Layout
from tests.conftest import make_sweep


def test_a_job_is_cancelled_a_minute_after_its_result_unless_the_profile_says_otherwise():
    sweep = make_sweep(launcher={"kind": "slurm"})
    assert RESULT_GRACE_S == 60.0
    assert SlurmLauncher(SlurmProfile(kind="slurm"), sweep).result_grace_s == 60.0
    assert SlurmLauncher(SlurmProfile(kind="slurm", result_grace_s=7), sweep).result_grace_s == 7.0
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        SlurmProfile(kind="slurm", result_grace_s=-1)


@pytest.mark.parametrize(
    "kind, cpus, ranks",
    [("builtin", 3, 8), ("builtin", None, 8), ("megatron", 3, 1), ("torchtitan", None, 1), ("command", 3, 1)],
)
def test_a_trials_job_runs_one_task_a_node_with_each_rank_its_cpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, cpus: int | None, ranks: int
):
    """One task on each node (re-attach waits for as many): the built-in trainer's forks the node's 8
    ranks, and asks for `cpus_per_task` (CPUs a rank) for each of them, by default the node's CPUs
    (sinfo's: 32 here); a trainer's own command is the node's one task. Each rank's OpenMP threads are
    its share of the task's CPUs, one at least."""
    monkeypatch.setattr(slurm, "node_cpus", lambda partition: 32)
    workload = {"kind": kind} if kind == "builtin" else {"kind": kind, "command": "run {flags}"}
    sweep = make_sweep(workload=workload)  # 8 nodes x 8 GPUs
    profile = SlurmProfile(kind="slurm", cpus_per_task=cpus)
    job = TrialJob(0, Layout(tp=1, pp=1, micro_batch_size=1), tmp_path / "s.yaml", tmp_path / "t", 600.0)
    params = SlurmLauncher(profile, sweep)._executor(job)._executor.parameters
    assert (params["nodes"], params["ntasks_per_node"]) == (8, 1)
    assert params["cpus_per_task"] == (cpus * ranks if cpus else 32)
    assert params["setup"][0] == omp_threads_line(ranks)
    reattached = SlurmLauncher(profile, sweep).reattach("7", job)
    assert reattached is None  # no job folder yet: nothing to re-attach to
    (tmp_path / "t" / "slurm").mkdir(parents=True)
    reattached = SlurmLauncher(profile, sweep).reattach("7", job)
    assert reattached is not None and reattached.native.num_tasks == 8


@pytest.mark.parametrize("cpus, ranks, threads", [("8", 4, 2), ("3", 2, 1), ("2", 4, 1), (None, 4, 1), ("16", 1, 16)])
def test_each_rank_of_a_task_gets_its_share_of_the_tasks_cpus(cpus: str | None, ranks: int, threads: int):
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CPUS_PER_TASK"} | (
        {"SLURM_CPUS_PER_TASK": cpus} if cpus else {}
    )
    line = omp_threads_line(ranks)
    out = subprocess.run(["bash", "-c", f"{line}; echo $OMP_NUM_THREADS"], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == str(threads), (line, out.stderr)


@pytest.mark.parametrize(
    "env, node",
    [
        ({}, 0),
        ({"RANK": "5", "LOCAL_WORLD_SIZE": "2"}, 2),  # ranks are placed node by node
        ({"RANK": "3", "LOCAL_WORLD_SIZE": "1"}, 3),  # one task per node: the rank is the node
        ({"RANK": "5", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "4"}, 4),  # torchrun says it itself
    ],
)
def test_a_tasks_node_from_torchrun_style_variables(env: dict[str, str], node: int):
    assert node_rank(env) == node


def _slurm_task_environ(monkeypatch: pytest.MonkeyPatch, job_id: str, procid: int, **extra: str) -> None:
    """This process as task `procid` of a SLURM job of 2 nodes x 2 tasks: the variables slurmstepd and
    submitit's batch file set in each task (submitit's JobEnvironment reads them), no torchrun-style ones."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    slurm = {
        "SLURM_JOB_ID": job_id,
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NODEID": str(procid // 2),
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_PROCID": str(procid),
        "SLURM_LOCALID": str(procid % 2),
        "SUBMITIT_EXECUTOR": "slurm",
    }
    for name, value in (slurm | extra).items():
        monkeypatch.setenv(name, value)


def test_every_task_of_a_job_takes_one_master_port_below_the_ephemeral_ones(monkeypatch: pytest.MonkeyPatch):
    # submitit draws the port from 20000-60000, across Linux's ephemeral ports (32768-60999 by
    # default), where an outgoing connection on the master node may hold it: a trial's rank 0 failed
    # to listen with EADDRINUSE
    ports = {}
    for job_id in ("7", "1234567", "987654321"):
        seen = set()
        for procid in range(4):
            _slurm_task_environ(monkeypatch, job_id, procid)
            export_task_environ()
            assert os.environ["RANK"] == str(procid) and os.environ["MASTER_ADDR"] == "gpu07"
            seen.add(int(os.environ["MASTER_PORT"]))
        assert len(seen) == 1, seen  # every task, on either node, the same port
        ports[job_id] = seen.pop()
    assert len(set(ports.values())) == 3, ports  # another job, another port
    drawn = [master_port_for(str(j)) for j in range(100_000, 102_000)] + [master_port_for(f"55_{t}") for t in range(99)]
    # below Linux's default ephemeral range, whatever this machine's ip_local_port_range says
    assert all(p in MASTER_PORTS for p in drawn) and min(drawn) >= 20000 and max(drawn) < 32768
    assert len(set(drawn)) > 1800  # spread over the range, not a few ports


@pytest.mark.parametrize("exported", [{"MASTER_PORT": "29777"}, {"MASTER_ADDR": "gpu08-ib", "MASTER_PORT": "29777"}])
def test_a_master_address_or_port_the_setup_lines_exported_is_kept(
    monkeypatch: pytest.MonkeyPatch, exported: dict[str, str]
):
    # `export MASTER_PORT=...` in a profile's setup lines (SLURM recipes have it) made submitit refuse
    # to export over it: the task failed before its rank started
    _slurm_task_environ(monkeypatch, "1234567", 2, **exported)
    export_task_environ()
    got = {name: os.environ[name] for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    assert got == {"MASTER_ADDR": "gpu07", "RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"} | exported


def test_the_master_port_is_the_same_in_every_process():
    # each task is its own process: a draw that hashed with Python's per-process salt would differ
    code = "from sweeper.launchers.slurm import master_port_for; print(master_port_for('1234567'))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code], env=os.environ | {"PYTHONHASHSEED": seed}, capture_output=True, text=True
        ).stdout.strip()
        for seed in ("1", "2", "3")
    }
    assert seen == {str(master_port_for("1234567"))}
