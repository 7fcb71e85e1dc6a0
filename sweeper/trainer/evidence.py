"""Why a rank process died, from evidence only: a SIGKILL is not an OOM by itself (a user, an
admin, a node agent or a test sends them too). An OOM needs one of
  - the cgroup's `oom_kill` counter (cgroup v2 `memory.events`, v1 `memory.oom_control`) rising
    while the trial ran,
  - the kernel log naming the rank's pid as killed for memory (when this user may read it),
  - a CUDA/PyTorch out-of-memory message in the rank's own log.
An unexplained death is an infrastructure failure: the sweep retries it once. No torch here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# The error of an unexplained rank death starts with this; the local launcher reads it to retry once.
INFRASTRUCTURE_FAILURE = "infrastructure failure"
_CUDA_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUBLAS_STATUS_ALLOC_FAILED|out of memory", re.IGNORECASE)


def _cgroup_dir() -> Path | None:
    """This process's cgroup folder (the ranks are its children, in the same cgroup)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            return Path("/sys/fs/cgroup") / path.lstrip("/")
        if "memory" in controllers.split(","):
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    return None


def oom_kill_count() -> int | None:
    """The cgroup's count of OOM kills so far (None when the counter cannot be read)."""
    d = _cgroup_dir()
    if d is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (d / name).read_text()
        except OSError:
            continue
        m = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        if m:
            return int(m.group(1))
    return None


def kernel_log_names(pid: int) -> bool:
    """The kernel log says the OOM killer killed `pid` (False when the log cannot be read)."""
    try:
        out = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    # "Out of memory: Killed process 1234 (python)", "oom-kill:...,task=python,pid=1234,uid=0"
    return re.search(rf"Killed process {pid}\b|oom-kill:.*\bpid={pid}\b", out) is not None


def oom_evidence(pid: int, log_text: str, oom_kills_before: int | None) -> str | None:
    """What shows that the rank with `pid` ran out of memory, or None when nothing does."""
    after = oom_kill_count()
    if oom_kills_before is not None and after is not None and after > oom_kills_before:
        return f"the cgroup's oom_kill counter rose from {oom_kills_before} to {after}"
    if kernel_log_names(pid):
        return f"the kernel log names pid {pid} as killed for memory"
    m = _CUDA_OOM.search(log_text)
    if m:
        return f"its log says {m.group(0)!r}"
    return None
