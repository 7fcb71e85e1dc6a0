"""A launch's output folder is its own: a trial restarted in the same folder (a restart, a retry)
starts without the last attempt's result or step times."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sweeper.launchers.ranks import core_of, launch

ROOT = Path(__file__).resolve().parents[2]


def test_a_relaunch_in_the_same_folder_does_not_read_the_last_attempt_s_result(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "result.json").write_text(json.dumps({"status": "ok", "mfu": 0.5}))
    (out / "steps.txt").write_text("0.1\n0.1\n")
    task = {"kind": "call", "target": "tests.ranks_targets:write_nothing", "kwargs": {}}
    done = launch(task, nprocs=1, timeout_s=60, workdir=tmp_path, extra_env={"PYTHONPATH": str(ROOT)})
    assert done.returncodes == [0] and not done.timed_out
    assert not (out / "result.json").exists() and not (out / "steps.txt").exists()


def test_a_timer_of_all_ranks_runs_as_many_collectives_on_each(tmp_path: Path) -> None:
    # `sweep profile`'s tensor-parallel blocks are timed on every rank at once: a rank whose first call
    # was slow (a loaded CPU) chose fewer repetitions, and gloo failed the profile ("Received data
    # size doesn't match expected size"); the slowest rank's estimate now decides for all
    counts = {}
    for together in (True, False):
        folder = tmp_path / str(together)
        task = {"kind": "call", "target": "tests.ranks_targets:time_together", "kwargs": {"together": together}}
        done = launch(task, nprocs=2, timeout_s=120, workdir=folder, extra_env={"PYTHONPATH": str(ROOT)})
        assert not done.timed_out
        counts[together] = [(folder / "out" / f"rank{r}.txt").read_text() for r in (0, 1)]
    assert counts[True][0] == counts[True][1] and counts[True][0].isdigit(), counts[True]
    assert counts[False][0] != counts[False][1], counts[False]  # each rank's own count: they part ways


def test_ranks_that_outnumber_the_cores_are_bound_one_core_each_round_robin(tmp_path: Path) -> None:
    # a pipeline's steps on 4 ranks of 2 cores took 0.11 or 0.20 s by where the scheduler put the
    # waiting ranks; bound, every core holds as many ranks and each rank stays on its core
    cores = sorted(os.sched_getaffinity(0))
    task = {"kind": "call", "target": "tests.ranks_targets:report_cores", "kwargs": {}}
    for nprocs, bound in ((len(cores) + 2, True), (1, False)):
        folder = tmp_path / str(nprocs)
        done = launch(task, nprocs=nprocs, timeout_s=120, workdir=folder, extra_env={"PYTHONPATH": str(ROOT)})
        assert done.returncodes == [0] * nprocs, done.log_tail(0)
        got = [(folder / "out" / f"cores{r}.txt").read_text() for r in range(nprocs)]
        # a bound rank's own affinity is one core; the cores its node shares are the launcher's (issue 48:
        # a profile of 4 ranks on 2 cores recorded cpus 1)
        assert {(folder / "out" / f"node_cpus{r}.txt").read_text() for r in range(nprocs)} == {str(len(cores))}
        if bound:
            assert got == [str(cores[r % len(cores)]) for r in range(nprocs)]
        else:
            assert got == [" ".join(map(str, cores))]  # a rank with cores of its own: left to the scheduler
    assert core_of(5, 6, [0, 1]) == 1 and core_of(0, 2, [0, 1]) is None and core_of(0, 3, []) is None


def test_ranks_are_forked_by_a_zygote_each_with_its_own_environment_log_and_session(tmp_path: Path) -> None:
    import json

    from sweeper.launchers.forking import forks_ranks

    task = {"kind": "call", "target": "tests.ranks_targets:report_start", "kwargs": {}}
    seen = {}
    for fork in ("1", "0"):
        folder = tmp_path / fork
        env = {"PYTHONPATH": str(ROOT), "SWEEP_FORK_RANKS": fork}
        done = launch(task, nprocs=2, timeout_s=120, workdir=folder, extra_env=env)
        assert done.returncodes == [0, 0] and not done.timed_out, done.log_tail(0)
        seen[fork] = [json.loads((folder / "out" / f"start{r}.json").read_text()) for r in (0, 1)]
        for r, got in enumerate(seen[fork]):
            assert (got["rank"], got["local_rank"]) == (str(r), str(r)) and got["own_session"]
            assert got["stdout"] == str(folder / "logs" / f"rank{r}.log")
            assert f"rank {r} says hello" in done.log(r).read_text()
    assert forks_ranks({}) and not forks_ranks({"SWEEP_FORK_RANKS": "0"})
    # forked: children of the zygote, which started before them (their start-up counts its imports)
    assert all("sweeper.runtime.zygote" in s["parent"] and s["started"] for s in seen["1"])
    assert all("sweeper.runtime.zygote" not in s["parent"] and s["started"] is None for s in seen["0"])
    assert all(s["main"].endswith("worker.py") for s in seen["0"] + seen["1"])
