"""The process helpers of every trial-execution layer (launcher, `sweep trial`, ranks, external commands).

Spawn in a new session, kill that session's whole process group, pick a free port, read the
result file a trial wrote. No torch, no submitit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any


def usable_cpus() -> int:
    """The cores this process may run on: its CPU affinity (`taskset`, a cgroup's cpuset, SLURM's
    binding), not the machine's count. A profile records it, and a rank's threads are sized by it."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


NODE_CPUS_VAR = "SWEEP_NODE_CPUS"


def node_cpus() -> int:
    """The cores a node's ranks share: what their launcher could use (`NODE_CPUS_VAR`: it binds each
    rank to one of them where they outnumber them, so a bound rank's own affinity is one core), else
    a SLURM job's cores on this node (its tasks' share of them), else this process's `usable_cpus`."""
    for var in (NODE_CPUS_VAR, "SLURM_CPUS_ON_NODE"):
        given = os.environ.get(var, "")
        if given.isdigit() and int(given) > 0:
            return int(given)
    return usable_cpus()


STARTED_VAR = "SWEEP_RANK_STARTED_UNIX"


# The socket of the fork server the local launcher keeps warm across a sweep's trials (`sweeper.runtime.zygote
# --serve`), in the environment of each of its trials: their launches fork their ranks from it. Already set
# in a sweep's own environment (its caller keeps one warm across several sweeps), the sweep uses that one.
SERVER_VAR = "SWEEP_ZYGOTE_SERVER"

# Variables no import of a rank reads, each read when it is used, in the rank's own environment (which its
# zygote sets after the fork): the tool's own settings, where caches and scratch files go (inductor's reads
# its variable at each use, and sets it in the process at the first), the address inductor sets in its own
# process before each compiled kernel it loads (which reads it there: a process that has compiled anything
# has one), the container engine a torchx trial submits to (a process that started a private dockerd names
# it), a test runner's name of the test, the CUDA allocator's settings (read when CUDA initialises, which a
# zygote never does: `sweep selftest` sets them in its own process before its launches), the terminal's
# size (read by whatever prints, when it prints). A launch whose environment differs from a warm server's
# in these alone is served.
READ_AT_USE = (
    "SWEEP_",
    "XDG_",
    "TMPDIR",
    "TORCHINDUCTOR_CACHE_DIR",
    "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
    "DOCKER_HOST",
    "PYTEST_CURRENT_TEST",
    "PYTORCH_CUDA_ALLOC_CONF",
    "COLUMNS",
    "LINES",
)


def read_at_use(name: str) -> bool:
    """Whether `name` is one of `READ_AT_USE` (a prefix ending in `_`, else the whole name)."""
    return any(name.startswith(p) if p.endswith("_") else name == p for p in READ_AT_USE)


def process_start_unix() -> float | None:
    """When this rank started (seconds since the epoch), from /proc; None where there is no /proc.
    A rank forked by the launch's zygote (`sweeper.runtime.zygote`) started when the zygote did: its
    imports were made there, and a trial's start-up counts them; one forked from a warm server's zygote,
    when its launch asked the server (the imports were made before, once for the sweep)."""
    if os.environ.get(STARTED_VAR):
        return float(os.environ[STARTED_VAR])
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def free_port() -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether process `pid` still runs: another user's process counts as running (it is not known
    dead), a zombie (it ended; its parent has not reaped it yet) does not, nor does a pid out of range."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def group_alive(pgid: int) -> bool:
    """Whether any process of group `pgid` still runs (zombies do not count). A SIGKILL to a
    group is delivered, not done: its members end one by one, a forked rank maybe after its parent."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone while we looked
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            return True
    return False


def kill_group(pid: int) -> bool:
    """SIGKILL the process group led by `pid` (a process started with `start_new_session=True`):
    the process and everything it started. False when it was already gone."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def die_with_parent(parent: int) -> None:
    """In a child before exec (`preexec_fn=partial(die_with_parent, os.getpid())`), or in a process at its
    start: SIGKILL it when its parent dies. A rank or a workload runs in its own session, so killing its
    launcher's process group (a SIGKILLed `sweep trial`, a cancelled trial, a stopped torchx replica)
    would otherwise leave it running, unsupervised and past any time limit. `parent`: the pid it must
    still have (its parent died before the prctl when it has another, and then it must not run)."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # a container's PID 1 may be the parent: compare, never assume 1
            os._exit(1)


def enter_netns(name: str) -> None:
    """Move this process into the named network namespace (`ip netns add NAME`: /run/netns/NAME), as
    `ip netns exec NAME` does before it execs its command; a forked rank of a node in a namespace calls
    it before anything opens a socket. Root only (CAP_SYS_ADMIN), as the namespaces are."""
    import ctypes

    CLONE_NEWNET = 0x40000000
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"cannot enter network namespace {name}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def read_result(path: Path) -> dict[str, Any] | None:
    """The result JSON object a trial wrote (a `TrialResult` as a mapping), or None when there is none.

    Text before the object (a stray print on stdout) is skipped; a file without a `status` is no result.
    """
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except ValueError:
        return None
    return data if isinstance(data, dict) and "status" in data else None
