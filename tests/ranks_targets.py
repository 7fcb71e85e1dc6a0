"""Functions a test launches on local ranks (`sweeper.launchers.ranks.launch`, task kind "call")."""

from __future__ import annotations

from pathlib import Path


def write_nothing(*, out_dir: Path) -> None:
    """A rank that ends at once and reports nothing."""


def wait_for_file(*, out_dir: Path, path: str, timeout_s: float = 120) -> None:
    """A rank that runs until `path` exists (what the test does meanwhile decides how it ends)."""
    import time

    deadline = time.monotonic() + timeout_s
    while not Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


def eat_memory(*, out_dir: Path, rank: int = 1) -> None:
    """Rank `rank` allocates until the OOM killer ends it (first in line: oom_score_adj 1000); the others end at once."""
    import os

    if os.environ["RANK"] != str(rank):
        return
    Path("/proc/self/oom_score_adj").write_text("1000")
    hoard = []
    while True:
        hoard.append(bytearray(16 << 20))


def sigkill_self(*, out_dir: Path, kernel_line: str | None = None) -> None:
    """A rank that SIGKILLs itself, first writing `kernel_line` ({pid}: its own) into the kernel log."""
    import os
    import signal

    if kernel_line is not None:
        with open("/dev/kmsg", "w") as f:
            f.write(kernel_line.format(pid=os.getpid()) + "\n")
    os.kill(os.getpid(), signal.SIGKILL)
