"""The ranks' fork servers as a launcher sees them (`sweeper.runtime.zygote` is what runs in them).

`Zygote` is one launch's: it asks a warm server for a zygote (`SERVER_VAR` in the environment: the local
launcher keeps one across a sweep's trials, `WarmZygote`) or starts one of its own, hands it the ranks,
and reads their pids and ends. No torch here.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any

from sweeper.files import open_own
from sweeper.process import NODE_CPUS_VAR, SERVER_VAR, die_with_parent, kill_group


def forks_ranks(env: Mapping[str, str]) -> bool:
    """Whether the ranks are forked from a zygote that imported torch once (`sweeper.runtime.zygote`),
    not each started as `python -m sweeper.runtime.worker`; SWEEP_FORK_RANKS=0 in the environment
    starts each one afresh (a site whose Python build or preloaded library cannot fork after torch)."""
    return env.get("SWEEP_FORK_RANKS", "1") != "0"


# After rank 0 wrote its result (or a rank died), how long the others get to finish on their own.
EXIT_GRACE_S = 15.0

# What `launch` sets in every rank's environment itself, whatever the caller's: no import reads them (the
# threads are set in each rank), so a warm zygote's environment is compared without them.
SET_BY_LAUNCH: tuple[str, ...] = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "PYTHONUNBUFFERED",
    "OMP_NUM_THREADS",
    NODE_CPUS_VAR,
)


def refusal(server: str, env: Mapping[str, str]) -> str | None:
    """Why the warm server at `server` would not take a launch from `env` (its environment differs from
    the server's: `sweeper.runtime.zygote`), or None when it would. Asked once (`callers_server`), before
    the first launch of a sweep, a profile or a self-test, of a server its caller keeps."""
    own = {k: v for k, v in env.items() if k not in SET_BY_LAUNCH}
    request = {"ranks": [], "environ": own, "set_by_launch": list(SET_BY_LAUNCH), "probe": True}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock, sock.makefile("r", encoding="utf-8") as reader:
        try:
            sock.connect(server)
            sock.sendall((json.dumps(request) + "\n").encode())
            answer = reader.readline().split(maxsplit=1)
        except OSError as e:
            return f"cannot reach it ({e})"
    if answer[:1] == ["takes"]:
        return None
    return answer[1].strip() if len(answer) > 1 else "it ended before it answered"


def callers_server(env: Mapping[str, str]) -> bool:
    """Whether `env` names a warm server its caller keeps (`process.SERVER_VAR`) that takes launches from
    `env` as it is now (this process's imports may have set variables since: torch's, inductor's). One
    that would not is said on stderr; the launches then need a server of their own."""
    server = env.get(SERVER_VAR)
    if not server:
        return False
    why = refusal(server, env)
    if why is not None:
        print(
            f"the fork server this environment names would not take its launches ({why}); keeping one of its own",
            file=sys.stderr,
        )
    return why is None


class Zygote:
    """The fork server of one launch: it forks every rank (each with its own environment, log, core and
    network namespace) and says how each ended. Forked by the warm server its environment names when that
    server takes the launch, else started for this launch alone."""

    def __init__(
        self,
        workdir: Path,
        env: dict[str, str],
        envs: list[dict[str, str]],
        cores: list[int | None],
        netns: list[str | None],
        *,
        set_by_launch: tuple[str, ...] = (),
    ):
        logs = [workdir / "logs" / f"rank{r}.log" for r in range(len(envs))]
        for path in logs:  # made ours (a link planted there is replaced), then written by the rank
            open_own(path).close()
        open_own(workdir / "logs" / "zygote.log").close()
        ranks: list[dict[str, Any]] = [
            {"env": e, "log": str(p), "core": c, "netns": n} for e, p, c, n in zip(envs, logs, cores, netns)
        ]
        self.proc: subprocess.Popen[str] | None = None
        self.sock: socket.socket | None = None
        # compared with the warm server's environment, less what the launch sets in each rank itself
        own = {k: v for k, v in env.items() if k not in set_by_launch}
        asked = {"ranks": ranks, "workdir": str(workdir), "environ": own, "set_by_launch": list(set_by_launch)}
        if not (env.get(SERVER_VAR) and self._ask_server(env[SERVER_VAR], asked)):
            self.out = self._start(workdir, env, ranks)
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        self.ended = False
        self.ranks = [ForkedRank(self, r, pid) for r, pid in enumerate(self._pids(len(envs)))]

    def _ask_server(self, path: str, asked: dict[str, Any]) -> bool:
        """Have the warm server fork this launch's zygote; False (said on stderr: a trial's log) when it cannot."""
        request = asked | {"asked": time.time()}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        reader = self.sock.makefile("r", encoding="utf-8")
        try:
            self.sock.connect(path)
            self.sock.sendall((json.dumps(request) + "\n").encode())
            answer = reader.readline().split(maxsplit=1)
        except OSError as e:
            answer = ["refuse", f"cannot reach it ({e})"]
        if answer[:1] == ["zygote"]:
            self.out, self.pid = reader, int(answer[1])
            return True
        why = answer[1].strip() if len(answer) > 1 else "it ended before it answered"
        print(f"the sweep's warm zygote did not take this launch ({why}); starting one for it", file=sys.stderr)
        reader.close()
        self.sock.close()
        self.sock = None
        return False

    def _start(self, workdir: Path, env: dict[str, str], ranks: list[dict[str, Any]]) -> IO[str]:
        with open_own(workdir / "logs" / "zygote.log") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "sweeper.runtime.zygote", str(workdir)],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
                preexec_fn=partial(die_with_parent, os.getpid()),
            )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.pid = self.proc.pid
        self.proc.stdin.write(json.dumps({"ranks": ranks}) + "\n")
        self.proc.stdin.close()
        return self.proc.stdout

    def close(self) -> None:
        """Wait for the zygote's end (it ends once its ranks have), killed if it lingers. A zygote of its
        own is reaped here (its usage, its ranks' included, is then this process's children's)."""
        if self.proc is not None:
            try:
                self.proc.wait(timeout=EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                kill_group(self.pid)
                self.proc.wait()
        elif not self.ended and not select.select([self.out], [], [], EXIT_GRACE_S)[0]:
            kill_group(self.pid)
        self.out.close()
        if self.sock is not None:
            self.sock.close()

    def _pids(self, n: int) -> list[int]:
        """The ranks' pids as the zygote forks them; -1 for each it never forked (it died first)."""
        while len(self.pids) < n and self._take(block=True):
            pass
        for r in range(n):
            if r not in self.pids:
                self.codes[r] = 1  # never started: a failed rank (the zygote's log says why)
        return [self.pids.get(r, -1) for r in range(n)]

    def _take(self, *, block: bool) -> bool:
        """Take in the zygote's next line (`pid R PID` or `exit R CODE`), waiting for one with `block`;
        False when there is none yet (not blocking) or the zygote has ended."""
        if self.ended or (not block and not select.select([self.out], [], [], 0)[0]):
            return False
        text = self.out.readline()
        if not text:  # it ended: every rank it had not reported ended with it (killed with their parent)
            if self.proc is not None:
                self.proc.wait()
            self.ended = True
            return False
        kind, rank, value = text.split()
        (self.pids if kind == "pid" else self.codes)[int(rank)] = int(value)
        return True

    def code(self, rank: int, *, block: bool) -> int | None:
        while rank not in self.codes and self._take(block=block):
            pass
        if rank not in self.codes and self.ended:  # the zygote is gone: its ranks died with it
            self.codes[rank] = -signal.SIGKILL
        return self.codes.get(rank)


class ForkedRank:
    """A rank the zygote forked: its pid, and its end as the zygote reports it."""

    def __init__(self, zygote: Zygote, rank: int, pid: int):
        self.zygote, self.rank, self.pid = zygote, rank, pid

    @property
    def returncode(self) -> int | None:
        return self.zygote.codes.get(self.rank)

    def poll(self) -> int | None:
        return self.zygote.code(self.rank, block=False)

    def wait(self) -> int:
        code = self.zygote.code(self.rank, block=True)
        assert code is not None
        return code


class WarmZygote:
    """A fork server kept warm across a sweep's local trials: it imports torch, dynamo and the trainer
    once (about 5 s of CPU), and each trial's launch has a zygote forked from it instead of starting one
    that imports them again. Its socket is in a folder of its own (0700); it dies with its launcher."""

    def __init__(self, sweep_folder: Path):
        self.folder = Path(tempfile.mkdtemp(prefix="sweep-zygote-"))  # short: a socket's path has 108 bytes
        self.path = self.folder / "socket"
        # the environment its imports read, and every trial it serves runs in: what the sweep's process
        # has now (its own imports may add to it later: scikit-learn sets KMP_* variables at the first refit)
        self.env = dict(os.environ)
        # bound and listening before the server starts: a trial that asks while its imports run waits in the
        # backlog, and one that asks after the server died is refused at once
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.path))
        listener.listen(64)
        with listener:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "sweeper.runtime.zygote",
                    "--serve",
                    str(listener.fileno()),
                    "--for",
                    str(sweep_folder),
                ],
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # a server that fails is seen by each launch, which starts its own zygote
                pass_fds=(listener.fileno(),),
                start_new_session=True,  # not in a trial's group: a cancelled trial leaves it
                preexec_fn=partial(die_with_parent, os.getpid()),
            )

    def environ(self) -> dict[str, str]:
        """The environment of a trial whose launches use this server: the server's own, and its socket."""
        return self.env | {SERVER_VAR: str(self.path)}

    def close(self) -> None:
        """Stop the server; zygotes it forked for trials still running keep running (each ends with its trial)."""
        kill_group(self.proc.pid)
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def warm_zygote(folder: Path) -> Iterator[dict[str, str]]:
    """A `WarmZygote` for the launches of a block (a profile's, a self-test's), stopped after it: yields the
    environment to launch them with (`launch(extra_env=...)`); an empty one where ranks are not forked, or
    where this process's environment names a server that takes its launches (they use that one)."""
    if not forks_ranks(os.environ) or callers_server(os.environ):
        yield {}
        return
    server = WarmZygote(folder)
    try:
        yield server.environ()
    finally:
        server.close()
