"""Why a rank process died, from evidence that names it: a SIGKILL is not an OOM by itself (a user,
an admin, a node agent or a test sends them too), and neither is an OOM kill of some other
process at the same moment. An OOM needs one of
  - the memory cgroup's own `oom_kill` counter (cgroup v2 `memory.events.local`, v1
    `memory.oom_control`) rising while the trial ran, in a cgroup that held only this trial's
    processes all along: its ranks, what they started, and the processes that started them (a
    shell, `sweep trial`, a SLURM task), which the OOM killer never picks over the ranks;
  - a kernel-log record written after the ranks started that names the rank's pid as killed for
    memory, read only in the kernel's own pid namespace (the log names the host's pids, which a
    container's pids are not);
  - a CUDA/PyTorch out-of-memory message in the rank's own log.
An unexplained death is an infrastructure failure: the sweep retries it once. No torch here.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

# The error of an unexplained rank death starts with this; the local launcher reads it to retry once.
INFRASTRUCTURE_FAILURE = "infrastructure failure"
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|out of memory", re.IGNORECASE)
# "Out of memory: Killed process 1234 (python)", "Memory cgroup out of memory: Killed process 1234 ...",
# "oom-kill:constraint=...,task=python,pid=1234,uid=0"
_KERNEL_OOM = re.compile(r"Killed process (\d+)\b|oom-kill:.*\bpid=(\d+)\b")
KMSG = Path("/dev/kmsg")
# the init pid namespace's inode, fixed by the kernel (PROC_PID_INIT_INO in include/linux/proc_ns.h)
INIT_PID_NS = "pid:[4026531836]"
MAX_KMSG_RECORDS = 200_000  # a ring buffer holds far fewer; a bound, not a limit met in practice


@dataclass(frozen=True)
class OomSigns:
    """What a launch saw of the OOM killer while its ranks ran."""

    counter_rise: tuple[int, int] | None = None  # the cgroup's oom_kill counter (before, after), when it rose
    cgroup_shared: str | None = None  # why that counter names no rank of this trial (None: it held only ours)
    killed_pids: frozenset[int] = frozenset()  # pids the kernel log named as OOM-killed since the start

    def note(self) -> str:
        """What the counter said but could not be taken as this trial's, for the failure's message."""
        if self.counter_rise is None or self.cgroup_shared is None:
            return ""
        before, after = self.counter_rise
        return (
            f"; the cgroup's oom_kill counter rose from {before} to {after}, but the cgroup also holds "
            f"{self.cgroup_shared}, so that kill need not be this trial's"
        )


def oom_evidence(pid: int, log_text: str, signs: OomSigns) -> str | None:
    """What shows that the rank with `pid` ran out of memory, or None when nothing does."""
    if signs.counter_rise is not None and signs.cgroup_shared is None:
        before, after = signs.counter_rise
        return f"the cgroup's oom_kill counter rose from {before} to {after}"
    if pid in signs.killed_pids:
        return f"the kernel log names pid {pid} as killed for memory"
    m = _CUDA_OOM.search(log_text)
    if m:
        return f"its log says {m.group(0)!r}"
    return None


class OomWatch:
    """Started before the ranks, told their pids while they run (`look`), ended once they ended (`finish`)."""

    def __init__(self) -> None:
        self.cgroup = CgroupWatch.start()
        self.kernel_log = KernelLog.open()

    def look(self, ranks: Sequence[int]) -> None:
        if self.cgroup is not None:
            self.cgroup.look(ranks)

    def finish(self, ranks: Sequence[int]) -> OomSigns:
        self.look(ranks)
        killed = self.kernel_log.oom_killed()
        if self.cgroup is None:
            return OomSigns(killed_pids=killed)
        return OomSigns(self.cgroup.rise(), self.cgroup.shared, killed)

    def close(self) -> None:
        self.kernel_log.close()


# ---- the memory cgroup --------------------------------------------------------------------
@dataclass
class CgroupWatch:
    """This process's memory cgroup, its oom_kill counter at the start, and whether every process
    seen in it belonged to this trial (checked at each look while the ranks run)."""

    counter: Path
    members: Path
    before: int
    ancestors: frozenset[int]  # this process and the ones that started it
    own: set[int] = field(default_factory=set)  # members known to be this trial's
    shared: str | None = None

    @classmethod
    def start(cls) -> CgroupWatch | None:
        found = _cgroup_counter()
        if found is None:
            return None
        counter, v2 = found
        before = _read_counter(counter)
        if before is None:
            return None
        watch = cls(counter, counter.parent / "cgroup.procs", before, _ancestors())
        # cgroup v2: a child cgroup's processes are charged here without being listed here
        if v2 and any(p.is_dir() for p in counter.parent.iterdir()):
            watch.shared = "child cgroups"
        return watch

    def look(self, ranks: Sequence[int]) -> None:
        if self.shared is not None:
            return
        try:
            pids = [int(x) for x in self.members.read_text().split()]
        except (OSError, ValueError):
            self.shared = "processes it cannot list"
            return
        for pid in pids:
            if pid in self.own:
                continue
            whose = _owner(pid, ranks, self.ancestors)
            if whose is None:  # gone between the listing and the look: too brief to matter
                continue
            if not whose:
                self.shared = f"process {pid} ({_comm(pid)})"
                return
            self.own.add(pid)

    def rise(self) -> tuple[int, int] | None:
        after = _read_counter(self.counter)
        return (self.before, after) if after is not None and after > self.before else None


def _cgroup_counter() -> tuple[Path, bool] | None:
    """The file of this process's memory cgroup holding its own oom_kill count, and whether it is cgroup v2."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2; .local: this cgroup's kills, not its descendants'
            d = Path("/sys/fs/cgroup") / path.lstrip("/")
            for name in ("memory.events.local", "memory.events"):
                if (d / name).is_file():
                    return d / name, True
        elif "memory" in controllers.split(","):  # v1 counts each cgroup's own kills
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control", False
    return None


def _read_counter(path: Path) -> int | None:
    try:
        m = re.search(r"^oom_kill (\d+)$", path.read_text(), re.MULTILINE)
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, ppid, pgrp, session, ...)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _ancestors() -> frozenset[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        fields = _stat(pid)
        pid = int(fields[1]) if fields else 0
    return frozenset(pids)


def _owner(pid: int, ranks: Sequence[int], ancestors: frozenset[int]) -> bool | None:
    """Whether `pid` is this trial's: a process that started the ranks, or one descended from this
    process (a rank, anything a rank started, in its session or not); None when it is gone."""
    if pid in ancestors:
        return True
    me = os.getpid()
    for _ in range(32):  # up the parents; an orphan (re-parented to init) is not known as ours
        fields = _stat(pid)
        if fields is None:
            return None
        if pid in ranks or int(fields[3]) in ranks:  # a rank, or in a rank's session
            return True
        pid = int(fields[1])
        if pid == me:
            return True
        if pid <= 1:
            return False
    return False


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "gone"


# ---- the kernel log ----------------------------------------------------------------------------
@dataclass
class KernelLog:
    """/dev/kmsg opened at the launch's start and positioned at its end, so that only records
    written since are read; not opened inside a pid namespace other than the kernel's, or when
    this user may not read the log."""

    fd: int | None

    @classmethod
    def open(cls) -> KernelLog:
        try:
            if os.readlink("/proc/self/ns/pid") != INIT_PID_NS:
                return cls(None)  # the log's pids are the host's, not this namespace's
            fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return cls(None)
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            os.close(fd)
            return cls(None)
        return cls(fd)

    def oom_killed(self) -> frozenset[int]:
        """The pids that the records written since the start name as killed for memory."""
        if self.fd is None:
            return frozenset()
        pids: set[int] = set()
        for _ in range(MAX_KMSG_RECORDS):
            try:
                record = os.read(self.fd, 8192)
            except BlockingIOError:
                break
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten before we read them: go on from the oldest kept
                    continue
                break
            if not record:
                break
            message = record.decode(errors="replace").split(";", 1)[-1].split("\n", 1)[0]
            m = _KERNEL_OOM.search(message)
            if m:
                pids.add(int(m.group(1) or m.group(2)))
        return frozenset(pids)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
