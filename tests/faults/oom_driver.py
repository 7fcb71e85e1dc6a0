"""Run by the OOM attribution tests as `python -m tests.faults.oom_driver JSON`: join a memory
cgroup, launch ranks running a function of `tests.ranks_targets` with the real launcher
(`sweeper.launchers.ranks.launch`), and print as JSON how they ended and what the launcher
makes of it (`Launched.oom()`, and the message of an unexplained death).

With `"old_line": true`, first write a kernel-log OOM record naming a pid, then have rank 0 take
that pid (ns_last_pid, root only; retried when another process takes it first)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def join(cgroup: str | None) -> None:
    if cgroup:
        Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))


def launch_once(args: dict[str, Any]) -> Any:
    from sweeper.launchers.ranks import launch

    task = {"kind": "call", "target": f"tests.ranks_targets:{args['target']}", "kwargs": args.get("kwargs", {})}
    return launch(task, nprocs=args["nprocs"], timeout_s=args.get("timeout_s", 120), workdir=Path(args["workdir"]))


def launch_as(pid: int, args: dict[str, Any]) -> Any:
    """Launch with rank 0 given `pid` after an OOM record naming it went into the kernel log."""
    with open("/dev/kmsg", "w") as f:
        f.write(f"Out of memory: Killed process {pid} (python3) total-vm:1000kB, anon-rss:1000kB\n")
    Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
    return launch_once(args)


def main(args: dict[str, Any]) -> dict[str, Any]:
    from sweeper.launchers.ranks import _unexplained

    join(args.get("cgroup"))
    if args.get("old_line"):
        # rank 0 must be the next process forked: each rank started afresh, not a zygote first
        os.environ["SWEEP_FORK_RANKS"] = "0"
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
        for _ in range(40):  # another process on the machine may fork first and take the pid
            want = (int(Path("/proc/sys/kernel/ns_last_pid").read_text()) + 400) % (pid_max - 1000) + 500
            done = launch_as(want, args)
            if done.pids[0] == want:
                break
        else:
            raise SystemExit("rank 0 never got the pid the old kernel-log record names")
    else:
        done = launch_once(args)
    return {
        "pids": done.pids,
        "returncodes": done.returncodes,
        "oom": done.oom(),
        "unexplained": _unexplained(done) if done.died else None,
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
