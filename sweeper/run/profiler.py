"""`sweep profile`: measure this node for the step-time model and write the profile file.

Everything is measured on one process per device of the node, started as a trial's ranks are
(`sweeper.launchers.ranks.launch`, `sweeper.runtime.profile_run.profile_worker`): the compute
(GEMMs, attention kernels, memory-bound work, launch overhead, the tiny block) on every rank at
once, then the collectives and the tensor-parallel block over all ranks. With a sweep file the
shapes are the sweep's (`sweeper.estimate.shapes`), else the default set.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable
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
from sweeper.launchers.netns import LocalNodes, existing, link_description, local_nodes, refuse_another_link
from sweeper.process import alive
from sweeper.profiles.profile import Profile, cached_profile_path, save_profile
from sweeper.run.reference_step import measure_reference, wants_reference

if TYPE_CHECKING:
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
    (the local cluster of network namespaces, `sweeper.launchers.netns`), which also measures the
    collectives across the link between them."""
    import torch

    local = cluster_nodes(nodes)

    if sweep is not None and sweep.cluster.gpu.name == "cpu":
        want_cuda = False  # a CPU sweep's trials run on the CPU, even on a node with GPUs
    cuda = want_cuda and torch.cuda.is_available()
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
    if cuda:
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
    where = ""
    if local is not None:
        if sweep is not None:  # a profile of another link than the sweep names would be refused by it
            refuse_another_link(local, ("cluster.link", sweep.cluster.link))
        kwargs["link"] = link_description(local)
        where = f" on each of {local.nodes} nodes ({', '.join(local.namespaces)}; link {kwargs['link']})"
    progress(f"measuring on {processes} process{'es' if processes > 1 else ''}{where} ({'GPU' if cuda else 'CPU'})")
    data = _launch_and_follow(kwargs, processes=processes, progress=progress, nodes=local)
    profile, skipped = Profile.model_validate(data["profile"]), dict(data["skipped"])
    if sweep is not None and sweep.cluster.gpu.name != profile.gpu:
        skipped["gpu"] = (
            f"this node's device is {profile.gpu} ({profile.device}), the sweep's cluster has {sweep.cluster.gpu.name}: "
            "the sweep will not read this profile"
        )
    path = out if out is not None else cached_profile_path(profile.gpu)
    if sweep is not None and wants_reference(profile, sweep):
        reference, why = measure_reference(profile, sweep, path=path, nodes=local, progress=progress)
        if reference is None:
            skipped["reference step"] = why
        profile = profile.model_copy(update={"reference_step": reference})
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


def _launch_and_follow(
    kwargs: dict[str, Any], *, processes: int, progress: Callable[[str], None], nodes: LocalNodes | None = None
) -> dict[str, Any]:
    """Run `profile_worker` on `processes` local ranks (per node of `nodes`), passing rank 0's progress
    lines on; its result."""
    from sweeper.launchers.ranks import launch

    remove_stale_workdirs(Path(tempfile.gettempdir()))
    workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
    # a SIGTERM (a scheduler's, `kill`) ends the process through the `finally` below, which removes the folder
    previous = (
        signal.signal(signal.SIGTERM, _exit_on_term) if threading.current_thread() is threading.main_thread() else None
    )
    task = {"kind": "call", "target": "sweeper.runtime.profile_run:profile_worker", "kwargs": kwargs}
    done: list[Any] = []
    thread = threading.Thread(
        target=lambda: done.append(launch(task, nprocs=processes, timeout_s=TIMEOUT_S, workdir=workdir, nodes=nodes)),
        daemon=True,
    )
    try:
        thread.start()
        log, seen = workdir / "logs" / "rank0.log", 0
        while thread.is_alive():
            thread.join(0.5)
            seen = _follow(log, seen, progress)
        _follow(log, seen, progress)
        path = workdir / "out" / "profile.json"
        if not done or not path.exists():
            tail = done[0].log_tail(0, 5).strip()[-600:] if done else ""
            why = "timed out" if done and done[0].timed_out else "ended without a profile"
            raise SweepError(f"the profile's measurement {why}: {' | '.join(tail.splitlines())}")
        result: dict[str, Any] = json.loads(path.read_text())
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


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
