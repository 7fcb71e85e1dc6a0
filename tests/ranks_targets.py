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


def time_together(*, out_dir: Path, together: bool) -> None:
    """Two gloo ranks time one all-reduce with `Timer`; rank 1's first call is slow (a loaded CPU).
    Each rank writes how many all-reduces it ran, or the error that ended it."""
    import os
    import time

    import torch
    import torch.distributed as dist

    from sweeper.runtime.profiling import Timer

    dist.init_process_group("gloo")
    rank, calls = dist.get_rank(), []
    buf = torch.ones(4)

    def step() -> None:
        calls.append(1)
        dist.all_reduce(buf)
        if rank == 1 and len(calls) == 2:  # after the collective: only rank 1's clock sees it
            time.sleep(0.05)  # the call that sets the repetitions

    try:
        Timer(torch.device("cpu"), budget_s=0.2, max_reps=1000, batches=1, together=together)(step)
        (out_dir / f"rank{rank}.txt").write_text(str(len(calls)))
    except RuntimeError as e:
        (out_dir / f"rank{rank}.txt").write_text(" ".join(str(e).split())[:200])
    os._exit(0)  # no teardown of a group whose peer may have failed


def report_netns(*, out_dir: Path) -> None:
    """Each rank names the network namespace it runs in (`ip netns identify`); rank 0 writes them all,
    gathered over gloo, in rank order to netns.txt."""
    import os
    import subprocess

    import torch.distributed as dist

    dist.init_process_group("gloo")
    mine = subprocess.run(["ip", "netns", "identify", str(os.getpid())], capture_output=True, text=True).stdout
    names: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(names, mine.strip() or "(none)")
    if dist.get_rank() == 0:
        (out_dir / "netns.txt").write_text(" ".join(str(n) for n in names))
    dist.destroy_process_group()


def report_cores(*, out_dir: Path) -> None:
    """Each rank writes the cores it may run on (its affinity) to cores<RANK>.txt, and the cores its
    node's ranks share (`sweeper.process.node_cpus`, what a profile records) to node_cpus<RANK>.txt."""
    import os

    from sweeper.process import node_cpus

    (out_dir / f"cores{os.environ['RANK']}.txt").write_text(" ".join(map(str, sorted(os.sched_getaffinity(0)))))
    (out_dir / f"node_cpus{os.environ['RANK']}.txt").write_text(str(node_cpus()))


def report_start(*, out_dir: Path) -> None:
    """Each rank writes, to start<RANK>.json, its rank variables, its parent's command line, what its
    stdout goes to, whether this module was imported before the rank ran, its session, the variables a
    warm server's zygote may take from the launch (`process.READ_AT_USE`) and where its scratch files go."""
    import json
    import os
    import sys
    import tempfile

    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    (out_dir / f"start{os.environ['RANK']}.json").write_text(
        json.dumps(
            {
                "rank": os.environ["RANK"],
                "local_rank": os.environ["LOCAL_RANK"],
                "parent": parent,
                "stdout": os.readlink("/proc/self/fd/1"),
                "main": sys.argv[0],
                "own_session": os.getsid(0) == os.getpid(),
                "started": os.environ.get("SWEEP_RANK_STARTED_UNIX"),
                "read_at_use": {
                    k: os.environ.get(k)
                    for k in (
                        "XDG_CACHE_HOME",
                        "TMPDIR",
                        "DOCKER_HOST",
                        "SWEEP_NOTE",
                        "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR",
                        "PYTORCH_CUDA_ALLOC_CONF",
                        "COLUMNS",
                        "LINES",
                    )
                },
                "tempdir": tempfile.gettempdir(),
            }
        )
    )
    print(f"rank {os.environ['RANK']} says hello")
