"""Start the rank processes of one trial on this machine, with torchrun-style variables and a wall-clock limit.

No torch here: the parent (the CLI, the local launcher) only starts the ranks, forked by a zygote that
imported torch once (`sweeper.runtime.zygote`; a rank of a node in a network namespace enters it after the
fork), or each as `python -m sweeper.runtime.worker` with SWEEP_FORK_RANKS=0, waits, and reads the result
rank 0 wrote. Each rank runs in its own session, so a timeout kills
it with everything it started (compile workers included).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from sweeper.files import open_own, own_dir
from sweeper.launchers.forking import EXIT_GRACE_S, SET_BY_LAUNCH, Zygote, forks_ranks
from sweeper.launchers.netns import LocalNodes, local_nodes
from sweeper.layouts.layout import Layout
from sweeper.process import NODE_CPUS_VAR, die_with_parent, free_port, kill_group, read_result, usable_cpus
from sweeper.results.trial import FAILED, OOM, TIMEOUT, TrialResult, without_run
from sweeper.runtime.evidence import INFRASTRUCTURE_FAILURE, OomSigns, OomWatch, oom_evidence
from sweeper.spec.sweep import Sweep


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of a trial over several machines meet, and this machine's place among them
    (a torchx app's replica: one per node). Without one, every rank runs here."""

    node_rank: int
    nodes: int
    master_addr: str
    master_port: int


@dataclass
class Launched:
    """How the processes of one launch ended."""

    workdir: Path
    returncodes: list[int | None]
    timed_out: bool
    killed_by_us: set[int]
    elapsed_s: float

    @property
    def out_dir(self) -> Path:
        return self.workdir / "out"

    pids: list[int] = field(default_factory=list)
    oom_signs: OomSigns = field(default_factory=OomSigns)  # what the OOM killer left while they ran

    @property
    def sigkilled(self) -> list[int]:
        """Ranks that died of a SIGKILL we did not send (the OOM killer, or anyone else)."""
        return [r for r, rc in enumerate(self.returncodes) if rc == -signal.SIGKILL and r not in self.killed_by_us]

    @property
    def died(self) -> list[int]:
        """Ranks that ended by a signal we did not send, first the SIGKILLed ones."""
        other = [
            r
            for r, rc in enumerate(self.returncodes)
            if rc is not None and rc < 0 and rc != -signal.SIGKILL and r not in self.killed_by_us
        ]
        return self.sigkilled + other

    def oom(self) -> tuple[int, str] | None:
        """(rank, evidence) of a rank SIGKILLed for memory; None without evidence (see trainer.evidence)."""
        for rank in self.sigkilled:
            why = oom_evidence(self.pids[rank], self.log_tail(rank, 200), self.oom_signs)
            if why:
                return rank, why
        return None

    def log(self, rank: int) -> Path:
        return self.workdir / "logs" / f"rank{rank}.log"

    def log_tail(self, rank: int, lines: int = 20) -> str:
        try:
            return "\n".join(self.log(rank).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def launch(
    task: dict[str, Any],
    *,
    nprocs: int,
    timeout_s: float,
    workdir: Path,
    extra_env: dict[str, str] | None = None,
    rendezvous: Rendezvous | None = None,
    nodes: LocalNodes | None = None,
) -> Launched:
    """Run `task` (see `sweeper.runtime.worker`) on `nprocs` local processes; kill them all at `timeout_s`.
    With a `rendezvous`, they are this node's ranks of a trial over `rendezvous.nodes` machines. With
    local `nodes` (network namespaces, `sweeper.launchers.netns`), `nprocs` ranks run in each, node k's
    in namespace k, meeting at node 0's address across the links."""
    # `workdir` is the caller's; what the launch makes in it is its own, and a link planted at one
    # of those names (a copied results folder) is replaced, never written through
    workdir.mkdir(parents=True, exist_ok=True)
    own_dir(workdir / "logs")
    own_dir(workdir / "out")
    # what `out` holds is this launch's own: a trial restarted in the same folder must not end on
    # the last attempt's result.json, nor be judged on its steps.txt (appended to, step by step)
    for stale in (workdir / "out").iterdir():
        if stale.is_symlink() or not stale.is_dir():
            stale.unlink()
    with open_own(workdir / "task.pkl") as f:  # the ranks unpickle it
        pickle.dump(task, f)
    rv = rendezvous or Rendezvous(0, 1, "127.0.0.1", free_port())
    if nodes is not None:  # the port is free in node 0's namespace: a fresh one has nothing listening
        rv = Rendezvous(0, nodes.nodes, nodes.master_addr, rv.master_port)
    homes = [(node, local) for node in range(nodes.nodes) for local in range(nprocs)] if nodes else None
    base = {
        **os.environ,
        "MASTER_ADDR": rv.master_addr,
        "MASTER_PORT": str(rv.master_port),
        "WORLD_SIZE": str(rv.nodes * nprocs),
        "LOCAL_WORLD_SIZE": str(nprocs),
        "GROUP_RANK": str(rv.node_rank),
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    # the namespaces of local nodes share this machine's cores: every rank of every node counts
    here = nprocs * (nodes.nodes if nodes else 1)
    # threads sized by the cores the ranks are bound to (the affinity), as the profile counts them
    cpus = usable_cpus()
    base.setdefault("OMP_NUM_THREADS", str(max(1, cpus // here)))
    base[NODE_CPUS_VAR] = str(cpus)  # what a bound rank cannot see: the cores it shares (a profile's cpus)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    watch = OomWatch()  # before the first rank: the kernel log is read from here on
    zygote: Zygote | None = None
    try:
        start = time.monotonic()
        envs = []
        for rank in range(nprocs * (nodes.nodes if nodes else 1)):
            node, local = homes[rank] if homes else (rv.node_rank, rank)
            env = base | {"RANK": str(node * nprocs + local), "LOCAL_RANK": str(local), "GROUP_RANK": str(node)}
            envs.append(env | (nodes.environ(node) if nodes else {}))
        if forks_ranks(base):
            netns: list[str | None] = (
                [nodes.namespaces[node] for node, _ in homes] if nodes and homes else [None] * len(envs)
            )
            cores_of = [core_of(r, here, cores) for r in range(here)]
            zygote = Zygote(workdir, base, envs, cores_of, netns, set_by_launch=SET_BY_LAUNCH)
            procs: list[Rank] = list(zygote.ranks)
        else:  # a process each (in its node's namespace: `ip netns exec`), started as the zygote's children would be
            procs = [_exec_rank(workdir, rank, env, nodes, core_of(rank, here, cores)) for rank, env in enumerate(envs)]
        pids = [p.pid for p in procs]
        timed_out, killed = _wait(
            procs, deadline=start + timeout_s, result=workdir / "out" / "result.json", look=lambda: watch.look(pids)
        )
        signs = watch.finish(pids)
    finally:
        watch.close()
        if zygote is not None:
            zygote.close()
    return Launched(workdir, [p.returncode for p in procs], timed_out, killed, time.monotonic() - start, pids, signs)


class Rank(Protocol):
    """One rank's process as `_wait` and `_kill` see it: `subprocess.Popen`'s part they use."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self) -> int: ...


def _exec_rank(workdir: Path, rank: int, env: dict[str, str], nodes: LocalNodes | None, core: int | None) -> Rank:
    argv = [sys.executable, "-m", "sweeper.runtime.worker", str(workdir)]
    node = int(env["GROUP_RANK"])
    with open_own(workdir / "logs" / f"rank{rank}.log") as log:
        return subprocess.Popen(
            nodes.command(node, argv) if nodes else argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=partial(_start_rank, os.getpid(), core),
        )


def core_of(rank: int, ranks: int, cores: list[int]) -> int | None:
    """The core that rank `rank` of this machine's `ranks` is bound to where they outnumber its `cores`
    (CPU ranks of several namespaces as nodes): round-robin, so every core holds as many ranks and a
    rank stays on its core. Left to the scheduler, a pipeline's steps took 0.11 or 0.20 s by where it
    happened to put the waiting ranks (pp=4 on 2 cores, the same trial, step to step); bound, 0.12-0.14 s.
    None where each rank has a core of its own (every GPU node): nothing is bound."""
    if not cores or ranks <= len(cores):
        return None
    return cores[rank % len(cores)]


def _start_rank(parent: int, core: int | None) -> None:
    """In the rank's process before exec: bound to `core` (if any), and killed with its launcher."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    die_with_parent(parent)


def _wait(procs: list[Rank], *, deadline: float, result: Path, look: Callable[[], None]) -> tuple[bool, set[int]]:
    """Wait for every process; end early once rank 0 reported or a rank died and the rest lingered.
    `look` is called at every round (the OOM watch's look at the cgroup's members).

    Returns (timed out, ranks we killed).
    """
    ending_at: float | None = None
    # poll() every rank each round (not any(), which stops at the first live one): a rank that
    # died while rank 0 waits in a collective must be seen now, not at the time limit
    while [p.poll() for p in procs].count(None):
        look()
        now = time.monotonic()
        if now >= deadline:
            return True, _kill(procs)
        if ending_at is None and (result.exists() or any(p.returncode not in (None, 0) for p in procs)):
            ending_at = now + EXIT_GRACE_S
        if ending_at is not None and now >= ending_at:
            return False, _kill(procs)
        time.sleep(0.05)
    return False, set()


def _kill(procs: list[Rank]) -> set[int]:
    """SIGKILL each live rank's whole session, reap them all; returns the ranks killed."""
    killed = set()
    for rank, p in enumerate(procs):
        if p.poll() is None:
            killed.add(rank)
            kill_group(p.pid)
    for p in procs:
        p.wait()
    return killed


def launch_trial(
    sweep: Sweep,
    layout: Layout,
    *,
    workdir: Path,
    timeout_s: float | None = None,
    extra_env: dict[str, str] | None = None,
    rendezvous: Rendezvous | None = None,
    nodes: LocalNodes | None = None,
) -> TrialResult:
    """Run one trial on `sweep.cluster.world` local processes and return rank 0's result; with a
    `rendezvous` at node 0, this node's `gpus_per_node` ranks of it (the other nodes: `launch`); with
    local `nodes` (or `SWEEP_NETNS`) of the cluster's node count, each node's ranks in its namespace.

    No result from rank 0 becomes `timeout` (the wall-clock limit killed it) or `failed` with the
    tail of the log of a rank that exited with an error, or `oom` when a rank was OOM-killed.
    """
    limit = timeout_s if timeout_s is not None else sweep.trial.timeout_min * 60
    task = {"kind": "trial", "sweep": sweep, "layout": layout}
    if nodes is None and rendezvous is None:
        nodes = local_nodes()  # SWEEP_NETNS: a trial of that many nodes runs in those namespaces
    nodes = nodes if nodes is not None and nodes.nodes == sweep.cluster.nodes else None
    split = rendezvous is not None or nodes is not None
    nprocs = sweep.cluster.gpus_per_node if split else sweep.cluster.world
    for attempt in (1, 2):
        folder = workdir if attempt == 1 else own_dir(workdir / "retry")
        done = launch(
            task,
            nprocs=nprocs,
            timeout_s=limit,
            workdir=folder,
            extra_env=extra_env,
            rendezvous=rendezvous,
            nodes=nodes,
        )
        path = done.out_dir / "result.json"
        # the free port was taken between choosing it and rank 0 listening on it: once more (an agreed
        # port of several nodes cannot change on one node alone)
        if rendezvous is not None or not (path.exists() and "EADDRINUSE" in path.read_text()):
            break
    oom = done.oom()
    written = read_result(path)
    if written is not None:
        result = TrialResult.from_dict(written)
        if result.status == FAILED and oom:
            result.status = OOM
            result.error = f"rank {oom[0]} was killed by SIGKILL for memory ({oom[1]}); then: {result.error}"
        elif result.status == FAILED and done.died:
            result.error = f"{_unexplained(done)}; then: {result.error}"
        return result
    if done.timed_out:
        return without_run(
            sweep,
            layout,
            status=TIMEOUT,
            error=f"no result within the wall-clock limit of {limit:.0f} s; all ranks killed",
        )
    if oom:
        return without_run(
            sweep, layout, status=OOM, error=f"rank {oom[0]} was killed by SIGKILL for memory ({oom[1]})"
        )
    if done.died:  # killed from outside, no sign of memory: the sweep retries it once
        return without_run(sweep, layout, status=FAILED, error=_unexplained(done))
    bad = next((r for r, rc in enumerate(done.returncodes) if rc != 0), 0)
    tail = done.log_tail(bad, 5).strip().replace("\n", " | ")
    return without_run(
        sweep, layout, status=FAILED, error=f"rank {bad} exited with code {done.returncodes[bad]} and no result: {tail}"
    )


def _unexplained(done: Launched) -> str:
    rank = done.died[0]
    sig = signal.Signals(-done.returncodes[rank]).name  # type: ignore[operator]
    return (
        f"{INFRASTRUCTURE_FAILURE}: rank {rank} was killed by {sig} with no sign of running out of memory "
        f"(cgroup oom_kill counter, kernel log, CUDA message){done.oom_signs.note()}"
    )
