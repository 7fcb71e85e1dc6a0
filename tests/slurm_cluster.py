"""A real local SLURM cluster for end-to-end tests: the session fixture `slurm_cluster`.

Three nodes by default (SWEEP_TEST_SLURM_NODES): three `slurmd -N NAME` daemons on this host,
so that tests can spread trials over nodes and set one DOWN under a running job.

Registered for the whole test suite by `pytest_plugins = ["tests.slurm_cluster"]` in
tests/conftest.py. A test that asks for `slurm_cluster` (and should be marked
`@pytest.mark.slurm`) gets a `SlurmCluster`: the cluster is up, its node idle, `sbatch`,
`srun`, `squeue`, `scancel` and `sacct` work, and submitit's `AutoExecutor` picks SLURM by itself.

The cluster is started once per session with scripts/slurm/start.sh (which needs root: it
installs Debian's packages and writes /etc/slurm) and stopped with `stop.sh --purge` at the end
of the session, so that each session starts fresh (job ids from 1, an empty accounting database).

Not root: the tests that use it are skipped, unless the environment variable CI is set (CI
must run them), in which case they fail. A start that fails as root always fails the tests.

Environment:
    SWEEP_TEST_SLURM_BASE   the cluster's SLURM_BASE (default /tmp/sweep-test-slurm)
    SWEEP_TEST_SLURM_NODES  slurmd daemons / node names (default 3; 1: one node named after the host)
    SWEEP_TEST_SLURM_KEEP   1: leave the cluster running after the session (the next session
                            reuses it at once; stop it with SLURM_BASE=... scripts/slurm/stop.sh)
    SLURM_CPUS, ...         the knobs of scripts/slurm/start.sh are passed through
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "scripts" / "slurm" / "start.sh"
STOP = ROOT / "scripts" / "slurm" / "stop.sh"
DEFAULT_BASE = "/tmp/sweep-test-slurm"
START_TIMEOUT_S = 600  # a cold start installs packages (~10 s here, longer on a slow mirror)
STOP_TIMEOUT_S = 120
# The launcher profile's `cpus_per_task` (CPUs a rank) of the tests' trials that train: the cluster advertises
# 4 CPUs a node on a 2-core machine (so that two jobs of two ranks fit), and the launcher's default share of
# them (2 a rank, OMP_NUM_THREADS 2) ran 8 threads on 2 cores when two trials ran at once, each spinning while
# it waited: a 30-step trial's two ranks took 63 and 69 s of CPU. tests/end_to_end/test_slurm.py's external
# workload keeps the default (the node's CPUs for its one task, from sinfo).
ONE_CORE = {"cpus_per_task": 1}


@dataclass(frozen=True)
class SlurmCluster:
    """The running cluster, as SLURM itself reports it (`sinfo`), not as configured."""

    partition: str  # the partition's name (also the default partition): e.g. "debug"
    nodes: tuple[str, ...]  # the node names, e.g. ("vm1", "vm2", "vm3"); ("vm",) for one node
    host: str  # the machine they all run on (the short hostname)
    cpus: int  # CPUs each node advertises (SLURM_CPUS, 4 by default)
    cluster_name: str  # ClusterName, as sacct knows it
    base: Path  # SLURM_BASE: state, logs, pid files, accounting database
    log_dir: Path  # slurmctld.log, slurmd.log, slurmdbd.log, mariadb.log

    def logs(self, lines: int = 30) -> str:
        """The last `lines` of each daemon's log, to put in a failing test's message."""
        out = []
        for path in [self.log_dir / "slurmctld.log", *sorted(self.log_dir.glob("slurmd*.log"))]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"==> {path} <==\n" + "\n".join(tail))
        return "\n".join(out)


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def _describe(env: dict[str, str]) -> SlurmCluster:
    base = Path(env["SLURM_BASE"])
    # one line per (node, partition): name|partition|CPUs
    lines = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N|%R|%c"], capture_output=True, text=True, check=True, timeout=30
    ).stdout.split()
    rows = [line.split("|") for line in lines]
    if not rows or len({(p, c) for _, p, c in rows}) != 1:
        raise RuntimeError(f"expected nodes alike in one partition, sinfo says {lines}")
    _, partition, cpus = rows[0]
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    name = next(
        line.split("=", 1)[1].strip() for line in config.splitlines() if line.split("=", 1)[0].strip() == "ClusterName"
    )
    return SlurmCluster(
        partition=partition,
        nodes=tuple(sorted(n for n, _, _ in rows)),
        host=os.uname().nodename.split(".")[0],
        cpus=int(cpus),
        cluster_name=name,
        base=base,
        log_dir=base / "log",
    )


def _session_env() -> dict[str, str]:
    """The environment of start.sh for the session's cluster."""
    env = dict(os.environ)
    env["SLURM_BASE"] = os.environ.get("SWEEP_TEST_SLURM_BASE", DEFAULT_BASE)
    # A test machine may carry a slurm.conf from another local recipe: start.sh keeps it as
    # *.before-sweep and `stop.sh --purge` puts it back, so the tests may replace it.
    env.setdefault("SLURM_FORCE", "1")
    env["SLURM_NODES"] = os.environ.get("SWEEP_TEST_SLURM_NODES", "3")
    env.pop("SLURM_NETNS", None)
    return env


@contextmanager
def on_namespaces(cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster remade for the block with the network namespaces of scripts/netns/start.sh
    as its nodes (SLURM_NETNS=1: node `sweep-node<k>`'s slurmd runs in namespace k), then as the session
    started it. The namespaces must exist for the whole block (`netns.shaped_link` around it)."""
    env = _session_env()
    del env["SLURM_NODES"]  # as many as there are namespaces
    started = _run(["bash", str(START)], {**env, "SLURM_NETNS": "1"}, START_TIMEOUT_S)
    try:
        if started.returncode != 0:
            pytest.fail(f"SLURM_NETNS=1 {START} failed (exit {started.returncode}):\n{started.stdout}", pytrace=False)
        yield _describe(env)
    finally:
        back = _run(["bash", str(START)], _session_env(), START_TIMEOUT_S)
        if back.returncode != 0:
            raise RuntimeError(f"{START} did not bring back the session's cluster {cluster.nodes}:\n{back.stdout}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the project's single-node SLURM (scripts/slurm/start.sh) for the session."""
    if os.geteuid() != 0:
        reason = (
            "the SLURM tests need root to start the project's local SLURM cluster "
            "(scripts/slurm/start.sh installs Debian packages and writes /etc/slurm); "
            "run pytest as root, or deselect them with -m 'not slurm'"
        )
        if _ci():
            pytest.fail(f"CI is set, so the SLURM tests must run, but: {reason}", pytrace=False)
        pytest.skip(reason)

    env = _session_env()
    keep = os.environ.get("SWEEP_TEST_SLURM_KEEP", "") == "1"

    try:
        started = _run(["bash", str(START)], env, START_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        _run(["bash", str(STOP), "--purge"], env, STOP_TIMEOUT_S)
        pytest.fail(f"{START} took longer than {START_TIMEOUT_S}s:\n{e.output}", pytrace=False)
    if started.returncode != 0:
        # stop what it did start (a half-started cluster would confuse the next session), but
        # keep the logs for the message
        _run(["bash", str(STOP)], env, STOP_TIMEOUT_S)
        pytest.fail(f"{START} failed (exit {started.returncode}):\n{started.stdout}", pytrace=False)
    print(started.stdout)  # shown with a failing test's report ("Captured stdout setup")
    try:
        yield _describe(env)
    finally:
        if not keep:
            stopped = _run(["bash", str(STOP), "--purge"], env, STOP_TIMEOUT_S)
            if stopped.returncode != 0:
                raise RuntimeError(f"{STOP} --purge failed:\n{stopped.stdout}")
