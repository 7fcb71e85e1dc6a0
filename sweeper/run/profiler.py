"""`sweep profile`: measure this node for the step-time model and write the profile file.

Everything is measured on one process per device of the node, started as a trial's ranks are
(`sweeper.launchers.ranks.launch`, `sweeper.runtime.profile_run.profile_worker`): the compute
(GEMMs, attention kernels, memory-bound work, launch overhead, the tiny block) on every rank at
once, then the collectives and the tensor-parallel block over all ranks. With a sweep file the
shapes are the sweep's (`sweeper.estimate.shapes`), else the default set.

`--nodes N`: one job of N nodes through the sweep's launcher. With the local launcher (or no sweep
file), the local cluster of network namespaces (`sweeper.launchers.netns`); with SLURM, one SLURM job
of N nodes x the sweep's GPUs per node (`SlurmLauncher.submit_call`), rank 0's output followed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.errors import SweepError
from sweeper.estimate.shapes import (
    CPU_KERNELS,
    DEFAULT_CPU,
    DEFAULT_GPU,
    GPU_KERNELS,
    PROGRESS_MARK,
    default_block_values,
    plan_for,
    sweep_block_values,
    sweep_workloads,
)
from sweeper.launchers.forking import warm_zygote
from sweeper.launchers.netns import LocalNodes, existing, link_description, local_nodes, refuse_another_link
from sweeper.process import alive
from sweeper.profiles.cache import cache_dir, cached_profile_path
from sweeper.profiles.profile import Profile, save_profile
from sweeper.run.reference_step import TrialRunner, measure_reference, wants_reference

if TYPE_CHECKING:
    from sweeper.launchers.slurm import SlurmLauncher
    from sweeper.layouts.layout import Layout
    from sweeper.results.trial import TrialResult
    from sweeper.spec.sweep import Sweep

TIMEOUT_S = 840.0  # every measurement of a node, the collectives included


@dataclass
class Measured:
    """A profile just measured, where it was written, and what was left out (with why)."""

    profile: Profile
    path: Path
    skipped: dict[str, str] = field(default_factory=dict)


def run_profile(
    sweep: Sweep | None,
    *,
    out: Path | None,
    quick: bool,
    progress: Callable[[str], None],
    want_cuda: bool = True,
    nodes: int = 1,
) -> Measured:
    """Measure this node (the sweep's shapes, or the default set) on one process per device, and write
    the profile to `out`, or to the user's cache for this GPU. `nodes` > 1: one job of that many nodes
    (a SLURM job for a sweep whose launcher is SLURM, else the local cluster of network namespaces,
    `sweeper.launchers.netns`), which also measures the collectives across the link between them."""
    import torch

    slurm = slurm_nodes(sweep, nodes)
    local = cluster_nodes(nodes) if slurm is None else None

    if sweep is not None and sweep.cluster.gpu.name == "cpu":
        want_cuda = False  # a CPU sweep's trials run on the CPU, even on a node with GPUs
    # a SLURM job runs on the cluster's nodes, which have the sweep's GPUs whatever this one has
    cuda = want_cuda and (slurm is not None or torch.cuda.is_available())
    if sweep is not None and not cuda and sweep.cluster.gpu.name != "cpu":
        raise SweepError(
            f"{sweep.source}: the cluster's GPU is {sweep.cluster.gpu.name} and this node has none that CUDA can use: "
            "run `sweep profile` on one of the cluster's nodes"
        )
    if sweep is not None:
        workloads, values = sweep_workloads(sweep), sweep_block_values(sweep)
        kernels = values["attention"]
        processes, precision, shapes_from = sweep.cluster.gpus_per_node, sweep.trial.precision, str(sweep.source)
    else:
        workloads = DEFAULT_GPU if cuda else DEFAULT_CPU
        values = default_block_values(cuda=cuda)
        kernels = GPU_KERNELS if cuda else CPU_KERNELS
        processes = torch.cuda.device_count() if cuda else 2
        precision, shapes_from = ("bf16" if cuda else "fp32"), "default"
    if cuda and slurm is None:
        processes = min(processes, torch.cuda.device_count())
    plan = plan_for(
        workloads,
        kernels=kernels,
        compile_=values["compile"] != ("false",),
        block_values=values,
        processes=processes,
        quick=quick,
    )
    kwargs: dict[str, Any] = {
        "plan": plan,
        "precision": precision,
        "shapes_from": shapes_from,
        "budget_s": 0.01 if quick else 0.03,
        "want_cuda": want_cuda,
    }
    where, noted = "", {}
    if local is not None:
        if sweep is not None:  # a profile of another link than the sweep names would be refused by it
            refuse_another_link(local, ("cluster.link", sweep.cluster.link))
        kwargs["link"] = link_description(local)
        where = f" on each of {local.nodes} nodes ({', '.join(local.namespaces)}; link {kwargs['link']})"
    if slurm is not None:
        assert sweep is not None
        kwargs["link"] = sweep.cluster.link  # no tc to read on a real cluster: the link the sweep names
        if sweep.cluster.link is None:
            noted["link"] = (
                "the sweep names no cluster.link, and on a SLURM cluster there is no tc to read it from: the profile "
                "records none, so no sweep can refuse it as measured across another link"
            )
        where = f" on each of {slurm.nodes} nodes (one SLURM job; link {sweep.cluster.link or 'not named'})"
    progress(f"measuring on {processes} process{'es' if processes > 1 else ''}{where} ({'GPU' if cuda else 'CPU'})")
    folder = (out.parent if out is not None else cache_dir()).resolve()  # a SLURM job's files: shared with the nodes
    # the local launches (the profile's ranks, then each reference step's) fork their ranks from one warm
    # zygote: torch, dynamo and the trainer imported once, not once a launch
    warm: AbstractContextManager[dict[str, str]] = warm_zygote(folder) if slurm is None else nullcontext({})
    with warm as env:
        if slurm is not None:
            data = run_job(
                slurm,
                PROFILE_TARGET,
                kwargs,
                nodes=slurm.nodes,
                tasks=processes,
                folder=folder,
                result_file=PROFILE_FILE,
                timeout_s=TIMEOUT_S,
                progress=progress,
            )
        else:
            data = _launch_and_follow(kwargs, processes=processes, progress=progress, nodes=local, env=env)
        profile, skipped = Profile.model_validate(data["profile"]), {**noted, **data["skipped"]}
        if sweep is not None and sweep.cluster.gpu.name != profile.gpu:
            skipped["gpu"] = (
                f"this node's device is {profile.gpu} ({profile.device}), the sweep's cluster has {sweep.cluster.gpu.name}: "
                "the sweep will not read this profile"
            )
        path = out if out is not None else cached_profile_path(profile.gpu)
        if sweep is not None and wants_reference(profile, sweep):
            runner = slurm_trial(slurm, folder, progress) if slurm is not None else None  # else local ranks
            try:
                references, why = measure_reference(
                    profile, sweep, path=path, nodes=local, progress=progress, runner=runner, env=env
                )
            except SweepError as e:  # its SLURM job ended without a result: the profile stands without it
                references, why = (), str(e)
            if not references:
                skipped["reference step"] = why
            profile = profile.model_copy(update={"reference_steps": references})
    try:
        save_profile(profile, path)
    except OSError as e:
        raise SweepError(f"--out {path}: cannot write the profile: {e.strerror}") from None
    return Measured(profile, path, skipped)


def cluster_nodes(nodes: int) -> LocalNodes | None:
    """The local nodes a profile of `nodes` nodes runs on: the namespaces `SWEEP_NETNS` names, else the
    `sweep-node<k>` ones of scripts/netns/start.sh; None for one node. Too few is one clear error."""
    if nodes < 1:
        raise SweepError(f"--nodes {nodes}: allowed: 1 or more")
    if nodes == 1:
        return None
    found = local_nodes() or (LocalNodes(existing()) if len(existing()) >= 2 else None)
    if found is None or found.nodes < nodes:
        have = f"{found.nodes} local nodes" if found else "no local nodes"
        raise SweepError(
            f"--nodes {nodes}: {have} here; start a cluster of {nodes} network namespaces with "
            f"`sudo scripts/netns/start.sh RATE [DELAY] {nodes}` (or name them in SWEEP_NETNS)"
        )
    return LocalNodes(found.namespaces[:nodes])


@dataclass(frozen=True)
class SlurmNodes:
    """A profile across nodes as one SLURM job of `nodes` nodes, through the sweep's SLURM launcher."""

    launcher: SlurmLauncher
    nodes: int


def slurm_nodes(sweep: Sweep | None, nodes: int) -> SlurmNodes | None:
    """The SLURM job a profile of `nodes` > 1 nodes runs as when the sweep's launcher is SLURM; None for
    one node, no sweep file or the local launcher (`cluster_nodes`). Any other launcher: one clear error."""
    if nodes <= 1 or sweep is None:
        return None
    from sweeper.launchers import make_launcher, resolve_profile
    from sweeper.launchers.slurm import SlurmLauncher

    kind = resolve_profile(sweep).kind
    if kind == "local":
        return None
    if kind != SlurmLauncher.kind:
        raise SweepError(
            f"--nodes {nodes} with launcher {kind}: a profile across nodes runs with launcher slurm (one SLURM "
            "job) or local (the network namespaces of scripts/netns/start.sh); measure with a copy of the sweep "
            "file whose launcher is one of them"
        )
    launcher = make_launcher(sweep)
    assert isinstance(launcher, SlurmLauncher)
    return SlurmNodes(launcher, nodes)


PROFILE_TARGET = "sweeper.runtime.profile_run:profile_worker"
PROFILE_FILE = "profile.json"  # what rank 0 writes in its out folder (`sweeper.runtime.profile_run`)


def run_job(
    on: SlurmNodes,
    target: str,
    kwargs: dict[str, Any],
    *,
    nodes: int,
    tasks: int,
    folder: Path,
    result_file: str,
    timeout_s: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Run `target` (`module:function`, called with `out_dir` and `kwargs`) as one SLURM job of `nodes` x
    `tasks`, its files in a folder made in `folder` (the profile's own: the nodes must share it), passing
    rank 0's progress lines on; the JSON file `result_file` it wrote in its out folder."""
    launcher = on.launcher
    folder.mkdir(parents=True, exist_ok=True)
    with _removed_at_exit(Path(tempfile.mkdtemp(prefix=f".{WORKDIR_PREFIX}{os.getpid()}-", dir=folder))) as workdir:
        call = launcher.submit_call(
            target,
            kwargs,
            folder=workdir,
            nodes=nodes,
            tasks=tasks,
            timeout_min=timeout_s / 60,
            name=f"sweep-{launcher.sweep.name}-profile",
        )
        ended, result = False, workdir / "out" / result_file
        try:
            progress(f"SLURM job {call.job_id}: {nodes} nodes x {tasks} tasks, files in {workdir}")
            seen, checked, written = 0, 0.0, None
            while True:
                time.sleep(0.5)
                seen = _follow(call.stdout, seen, progress)
                if time.monotonic() - checked < launcher.poll_s:
                    continue
                checked = time.monotonic()
                if ended := call.done():
                    break
                if result.exists():  # written: a task stuck in teardown must not hold the nodes on
                    written = written or checked
                    if checked - written > launcher.result_grace_s:
                        break
            _follow(call.stdout, seen, progress)
        finally:
            if not ended:  # interrupted, or a task hung after the result
                call.cancel()
        if not result.exists():
            tail = " | ".join(call.error_tail().strip()[-600:].splitlines())
            raise SweepError(f"SLURM job {call.job_id} ended {call.state()} without writing {result_file}: {tail}")
        progress(f"SLURM job {call.job_id} ran on {call.nodelist() or 'nodes sacct does not name'}")
        data: dict[str, Any] = json.loads(result.read_text())
        return data


def slurm_trial(on: SlurmNodes, folder: Path, progress: Callable[[str], None]) -> TrialRunner:
    """Run one trial (the reference step's) as a SLURM job of its sweep's nodes x GPUs per node; its result."""
    from sweeper.results.trial import TrialResult

    def run(sweep: Sweep, layout: Layout) -> TrialResult:
        data = run_job(
            on,
            "sweeper.runtime.runner:run_trial",
            {"sweep": sweep, "layout": layout},
            nodes=sweep.cluster.nodes,
            tasks=sweep.cluster.gpus_per_node,
            folder=folder,
            result_file="result.json",
            timeout_s=sweep.trial.timeout_min * 60,
            progress=progress,
        )
        return TrialResult.from_dict(data)

    return run


@contextmanager
def _removed_at_exit(workdir: Path) -> Iterator[Path]:
    """`workdir`, removed after the block; a SIGTERM (a scheduler's, `kill`) ends the process through it too."""
    previous = (
        signal.signal(signal.SIGTERM, _exit_on_term) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        yield workdir
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _launch_and_follow(
    kwargs: dict[str, Any],
    *,
    processes: int,
    progress: Callable[[str], None],
    nodes: LocalNodes | None = None,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run `profile_worker` on `processes` local ranks (per node of `nodes`), passing rank 0's progress
    lines on; its result."""
    from sweeper.launchers.ranks import launch

    remove_stale_workdirs(Path(tempfile.gettempdir()))
    task = {"kind": "call", "target": PROFILE_TARGET, "kwargs": kwargs}
    done: list[Any] = []
    with _removed_at_exit(Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))) as workdir:
        thread = threading.Thread(
            target=lambda: done.append(
                launch(task, nprocs=processes, timeout_s=TIMEOUT_S, workdir=workdir, nodes=nodes, extra_env=env)
            ),
            daemon=True,
        )
        thread.start()
        log, seen = workdir / "logs" / "rank0.log", 0
        while thread.is_alive():
            thread.join(0.5)
            seen = _follow(log, seen, progress)
        _follow(log, seen, progress)
        path = workdir / "out" / PROFILE_FILE
        if not done or not path.exists():
            tail = done[0].log_tail(0, 5).strip()[-600:] if done else ""
            why = "timed out" if done and done[0].timed_out else "ended without a profile"
            raise SweepError(f"the profile's measurement {why}: {' | '.join(tail.splitlines())}")
        result: dict[str, Any] = json.loads(path.read_text())
        return result


WORKDIR_PREFIX = "sweep-profile-"  # then the measuring process's id: a folder of a dead one is stale


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def remove_stale_workdirs(tmp: Path) -> list[Path]:
    """Remove the measuring folders that a `sweep profile` killed outright (SIGKILL: no `finally` ran)
    left under `tmp`: the user's own folders (not links) named for a process that no longer runs."""
    removed = []
    for p in tmp.glob(f"{WORKDIR_PREFIX}*-*"):
        pid = p.name.removeprefix(WORKDIR_PREFIX).split("-", 1)[0]
        try:
            st = p.lstat()
        except OSError:
            continue
        if not (pid.isdigit() and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()) or alive(int(pid)):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def _follow(log: Path, seen: int, progress: Callable[[str], None]) -> int:
    """Pass on the complete lines written to `log` past byte `seen`; returns the new offset."""
    try:
        data = log.read_bytes()[seen:]
    except OSError:
        return seen
    end = data.rfind(b"\n") + 1
    for line in data[:end].decode(errors="replace").splitlines():
        if line.startswith(PROGRESS_MARK):  # torch's own warnings stay in the log
            progress(line.removeprefix(PROGRESS_MARK).strip())
    return seen + end
