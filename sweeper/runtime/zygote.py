"""The ranks' fork server: `python -m sweeper.runtime.zygote WORKDIR`, started by `launch` once per launch.

Importing torch, torch.distributed and the trainer costs each rank about 4 s of CPU (torch 2 s, dynamo,
which the optimizers import, 1.7 s, the trainer 0.5 s): a 2-rank trial spent more on imports than on
its steps. The zygote imports what the launch's task needs once (`warm`) and forks every rank of the
launch from there; a forked rank starts with it imported, as a DataLoader worker does. Nothing here starts a thread, touches a
device or reads a rank's environment before the fork: CUDA and the process group start in the rank.

Protocol (one launch): the launcher writes on stdin one JSON object, {"ranks": [{"env": {...}, "log":
path, "core": int | null, "netns": name | null}, ...]}, and closes it. The zygote forks rank r (in a
session of its own, in its node's network namespace when it has one, bound to its core, killed with the
zygote, its environment replaced, stdout and stderr to its log) and
prints `pid R PID`; then, as each rank ends, `exit R CODE` (CODE as `Popen.returncode`: negative for a
signal), and exits once every rank has. It dies with its launcher.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any


def warm(workdir: Path) -> None:
    """What every rank of the launch's task imports before its work (its own imports are then free):
    for a trial, torch, dynamo (the optimizers import it at their construction) and the trainer; for a
    function (`call`), its module, and nothing it does not import (a light rank stays light)."""
    with open(workdir / "task.pkl", "rb") as f:
        task = pickle.load(f)  # written by our own launcher, for this launch only
    if task["kind"] == "trial":
        import torch._dynamo  # noqa: F401

        import sweeper.runtime.runner  # noqa: F401
    else:
        importlib.import_module(task["target"].split(":")[0])


def start_rank(workdir: Path, spec: dict[str, Any], zygote: int, started: float | None) -> None:
    """In the forked child: become rank `spec` and run it (never returns)."""
    from sweeper.process import STARTED_VAR, die_with_parent, enter_netns

    code = 1
    try:
        os.setsid()  # its own session: a timeout kills it with everything it starts
        if spec.get("netns"):  # a node of namespaces as nodes: its sockets there, before any is opened
            enter_netns(spec["netns"])
        if spec.get("core") is not None:
            os.sched_setaffinity(0, {int(spec["core"])})
        die_with_parent(zygote)
        fd = os.open(spec["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdout.reconfigure(line_buffering=True)  # as PYTHONUNBUFFERED gives an exec'd rank
        sys.stderr.reconfigure(line_buffering=True)
        os.environ.clear()
        os.environ.update(spec["env"])
        if started is not None:
            os.environ[STARTED_VAR] = str(started)
        threads = spec["env"].get("OMP_NUM_THREADS")
        if threads and "torch" in sys.modules:  # read by OpenMP at its start, which the zygote never reached
            sys.modules["torch"].set_num_threads(int(threads))
        sys.argv = [str(Path(__file__).with_name("worker.py")), str(workdir)]
        from sweeper.runtime.worker import main

        code = main(workdir)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # as the worker: no interpreter shutdown (torch's teardown aborts now and then)


def serve(workdir: Path) -> int:
    """Fork the ranks the launcher asks for, say their pids, then how each ended."""
    from sweeper.process import process_start_unix

    started = process_start_unix()  # the ranks' start: what the zygote imports is their start-up
    warm(workdir)
    ranks = json.loads(sys.stdin.read())["ranks"]
    zygote, pids = os.getpid(), {}
    for rank, spec in enumerate(ranks):
        sys.stdout.flush()  # a child must not inherit (and write) what the zygote had buffered
        pid = os.fork()
        if pid == 0:
            start_rank(workdir, spec, zygote, started)
        pids[pid] = rank
        print(f"pid {rank} {pid}", flush=True)
    while pids:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid in pids:
            print(f"exit {pids.pop(pid)} {os.waitstatus_to_exitcode(status)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1])))
