"""The ranks' fork servers: `python -m sweeper.runtime.zygote WORKDIR`, started by `launch` for one
launch, or `python -m sweeper.runtime.zygote --serve FD --for FOLDER`, kept warm by the local
launcher across a sweep's trials (FD: the unix socket it listens on, bound by the launcher).

Importing torch, torch.distributed and the trainer costs each rank about 4 s of CPU (torch 2 s, dynamo,
which the optimizers import, 1.7 s, the trainer 0.5 s): a 2-rank trial spent more on imports than on
its steps. The zygote imports what the launch's task needs once (`warm`) and forks every rank of the
launch from there; a forked rank starts with it imported, as a DataLoader worker does. Nothing here starts a thread, touches a
device or reads a rank's environment before the fork: CUDA and the process group start in the rank.

Protocol (one launch): the launcher writes one line, a JSON object {"ranks": [{"env": {...}, "log":
path, "core": int | null, "netns": name | null}, ...]}. The zygote forks rank r (in a
session of its own, in its node's network namespace when it has one, bound to its core, killed with the
zygote, its environment replaced, stdout and stderr to its log) and
prints `pid R PID`; then, as each rank ends, `exit R CODE` (CODE as `Popen.returncode`: negative for a
signal), and exits once every rank has. It dies with its launcher.

Warm (`--serve`): the same zygote, forked afresh for each launch from a server that imported a trial's
modules once, so a sweep's trials after its first start with them imported. A launch connects to the
server's unix socket and writes the same line with more keys: "workdir", "environ" (its ranks' common
environment, which must be the server's but for `process.READ_AT_USE`: what torch reads at its import was
read there), "set_by_launch" (the variables left out of that comparison too: set in each rank, read by no
import) and "asked" (when it asked: its ranks' start). The forked zygote answers `zygote PID` (or `refuse WHY`, and the launch starts
a zygote of its own), then speaks as above; it dies when the launch's end of the socket closes. A request
with "probe" true (and no ranks) is answered `takes` or `refuse WHY`, and ends there.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, TextIO

from sweeper.process import SERVER_VAR, read_at_use


def warm(workdir: Path | None) -> None:
    """What every rank of the launch's task imports before its work (its own imports are then free):
    for a trial (and for the warm server, which serves trials), torch, dynamo (the optimizers import it
    at their construction) and the trainer; for a function (`call`), its module, and nothing it does
    not import (a light rank stays light)."""
    task = {"kind": "trial"}
    if workdir is not None:
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
        _redirect(spec["log"], (1, 2))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        sys.stdout.reconfigure(line_buffering=True)  # as PYTHONUNBUFFERED gives an exec'd rank
        sys.stderr.reconfigure(line_buffering=True)
        os.environ.clear()
        os.environ.update(spec["env"])
        if "tempfile" in sys.modules:  # the folder it found first was the zygote's TMPDIR, which may not be this one
            sys.modules["tempfile"].tempdir = None
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


def _redirect(path: str, fds: tuple[int, ...], *, append: bool = False) -> None:
    """Point `fds` at the file `path` made for it by the launcher (never through a link planted there)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    for target in fds:
        os.dup2(fd, target)
    os.close(fd)


def fork_ranks(
    workdir: Path, request: dict[str, Any], replies: TextIO, started: float | None, *, conn: socket.socket | None = None
) -> dict[int, int]:
    """Fork the ranks `request` asks for and say their pids on `replies`; returns pid -> rank. `conn`:
    the warm zygote's socket, which no rank keeps (its launch must see the zygote's end)."""
    warm(workdir)
    zygote, pids = os.getpid(), {}
    for rank, spec in enumerate(request["ranks"]):
        replies.flush()  # a child must not inherit (and write) what the zygote had buffered
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            if conn is not None:
                conn.close()
            start_rank(workdir, spec, zygote, started)
        pids[pid] = rank
        print(f"pid {rank} {pid}", file=replies, flush=True)
    return pids


def report_exits(pids: dict[int, int], replies: TextIO) -> int:
    """Say `exit R CODE` as each rank of `pids` (pid -> rank) ends; return once all have."""
    while pids:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        if pid in pids:
            print(f"exit {pids.pop(pid)} {os.waitstatus_to_exitcode(status)}", file=replies, flush=True)
    return 0


def serve_warm(fd: int) -> int:
    """On the listening unix socket `fd` (bound by the launcher in a folder of its own, 0700: nobody else
    can connect), import a trial's modules, then fork a zygote for each launch that connects. Runs until
    it is killed."""
    listener = socket.socket(fileno=fd)
    environ = dict(os.environ)  # before the imports, which may set variables of their own
    warm(None)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # its zygotes are reaped by the kernel, not waited for
    while True:
        conn, _ = listener.accept()
        pid = os.fork()
        if pid == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the zygote waits for its ranks
            code = 1
            try:
                code = _serve_one(conn, environ)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        conn.close()


def _serve_one(conn: socket.socket, environ: dict[str, str]) -> int:
    """In a zygote forked for one launch: check its environment, then serve it as a zygote of its own would."""
    os.setsid()  # its own group, as a zygote started for the launch: the launch can kill it
    replies = conn.makefile("w", encoding="utf-8")
    request = json.loads(conn.makefile("r", encoding="utf-8").readline() or "null")
    if not isinstance(request, dict):
        return 1  # the launch went away before it asked
    asked, skip = request["environ"], {SERVER_VAR, *request["set_by_launch"]}
    differs = sorted(
        k
        for k in asked.keys() | environ.keys()
        if asked.get(k) != environ.get(k) and k not in skip and not read_at_use(k)
    )
    if differs:
        print(f"refuse the launch's environment differs from the server's in {', '.join(differs[:8])}", file=replies)
        replies.flush()
        return 0
    if request.get("probe"):  # a sweep asking whether its trials would be taken (`forking.refusal`)
        print("takes", file=replies, flush=True)
        return 0
    workdir = Path(request["workdir"])
    _redirect(str(workdir / "logs" / "zygote.log"), (2,), append=True)
    print(f"zygote {os.getpid()}", file=replies, flush=True)
    pids = fork_ranks(workdir, request, replies, request.get("asked"), conn=conn)
    # its launch's end closes when the launch ends, killed or not: the zygote ends then, and its ranks with it
    threading.Thread(target=_end_with, args=(conn,), daemon=True).start()
    return report_exits(pids, replies)


def _end_with(conn: socket.socket) -> None:
    try:
        while conn.recv(4096):
            pass
    except OSError:
        pass
    os._exit(1)


def main(argv: list[str]) -> int:
    from sweeper.process import process_start_unix

    if argv[:1] == ["--serve"]:
        return serve_warm(int(argv[1]))  # argv[2:] (`--for FOLDER`) names its sweep for `ps`
    started = process_start_unix()  # the ranks' start: what the zygote imports is their start-up
    workdir = Path(argv[0])
    return report_exits(fork_ranks(workdir, json.loads(sys.stdin.readline()), sys.stdout, started), sys.stdout)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
