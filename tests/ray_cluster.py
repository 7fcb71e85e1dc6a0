"""A real local Ray head for the torchx launcher's `ray` tests: the session fixture `ray_head`.

Registered for the whole test suite by `pytest_plugins` in tests/conftest.py. A test that asks for
`ray_head` (and should be marked `@pytest.mark.ray`) gets a `RayHead`: `ray start --head` with 2 CPUs,
every port it opens chosen free (so that it runs beside any other Ray on the machine), its own short
temporary folder, and its dashboard's job API answering (torchx's `ray` scheduler submits there:
cfg `dashboard_address=head.dashboard`).

Stopped after the last test that uses it (`pytest_runtest_teardown`; its dashboard, agents and
monitors took about 250 s of CPU over a whole run when it lived to the end of the session), else at
the end of the session, by its own processes only: every process whose command line or working
directory names its temporary folder, and their process groups (SIGTERM, then SIGKILL: ~4 s); never
`ray stop`, which ends every Ray process of the machine, another user's head included. The stop then
checks that none of them is left.

Ray not installed (with its dashboard: `ray[default]`): the tests that use it are skipped, unless the
environment variable CI is set (CI must run them), in which case they fail.

Environment:
    SWEEP_TEST_RAY_CPUS  CPUs the head advertises (default 2)
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

START_TIMEOUT_S = 180  # `ray start` takes ~10 s on 2 cores; the dashboard answers a few seconds later
STOP_GRACE_S = 10  # SIGTERM, then SIGKILL
WORKER_PORTS = 100  # the range of ports Ray's worker processes listen on (one each)
# the ports `ray start --head` opens, one flag each (ray 2.60: `ray start --help`)
PORT_FLAGS = (
    "--port",  # GCS
    "--dashboard-port",
    "--node-manager-port",
    "--object-manager-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--runtime-env-agent-port",
    "--metrics-export-port",
)


@dataclass(frozen=True)
class RayHead:
    """The running head: where torchx and Ray clients reach it, and the folder that names its processes."""

    address: str  # GCS, "127.0.0.1:P" (ray.init(address=...), `ray status --address`)
    dashboard: str  # "127.0.0.1:D": the job API (torchx cfg dashboard_address, JobSubmissionClient("http://" + it))
    temp_dir: Path  # --temp-dir: sessions, logs, sockets; every process of the head names it

    def logs(self, lines: int = 30) -> str:
        """The last `lines` of the head's main logs, to put in a failing test's message."""
        out = []
        folder = self.temp_dir / "session_latest" / "logs"
        for name in ("gcs_server.out", "raylet.out", "dashboard.log", "dashboard_agent.log"):
            path = folder / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"==> {path} <==\n" + "\n".join(tail))
        return "\n".join(out) or f"(no logs under {folder})"


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _bindable(port: int) -> bool:
    """Nothing listens on `port` of any address (the head binds 127.0.0.1; another Ray may hold it elsewhere)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free now (the kernel's picks; a race with another process is possible but rare)."""
    ports: list[int] = []
    sockets = []
    try:
        while len(ports) < n:  # held open together, so that the kernel picks n different ones
            s = socket.socket()
            s.bind(("", 0))
            sockets.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in sockets:
            s.close()
    return ports


def free_range(size: int, avoid: set[int]) -> tuple[int, int]:
    """A run of `size` free ports below the kernel's ephemeral range (whose ports the kernel gives to
    outgoing connections and to `free_ports`), none of them in `avoid`."""
    low_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(200):
        first = rng.randrange(20000, low_ephemeral - size)
        run = range(first, first + size)
        if not avoid.intersection(run) and all(_bindable(p) for p in run):
            return first, first + size - 1
    raise RuntimeError(f"no run of {size} free ports found in 20000..{low_ephemeral}")


def ray_command() -> str:
    """The `ray` script beside this interpreter (the venv's), else the one on PATH."""
    beside = Path(sys.executable).parent / "ray"
    found = str(beside) if beside.exists() else shutil.which("ray")
    if found is None:
        raise RuntimeError("no `ray` command beside this Python or on PATH")
    return found


def head_processes(temp_dir: Path, pgid: int | None = None) -> dict[int, str]:
    """The processes of the head of `temp_dir`: pid -> command line. Those whose command line or
    working directory names `temp_dir` (Ray's daemons name it; workers, which rename themselves
    `ray::...`, run in it or in a folder under it), and every member of their process groups and of
    `pgid` (the group `ray start` made). Never this process or its group."""
    mine = {os.getpid(), os.getpgrp()}
    needle = str(temp_dir)
    found: dict[int, str] = {}
    groups: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            groups[pid] = os.getpgid(pid)
        except OSError:  # gone meanwhile
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:  # another user's process (not root), or gone meanwhile
            cwd = ""
        if needle in cmdline or cwd == needle or cwd.startswith(needle + "/"):
            found[pid] = cmdline
    wanted = {groups[p] for p in found if p in groups} | ({pgid} if pgid else set())
    wanted -= mine | {0, 1}
    for pid, group in groups.items():
        if group in wanted and pid not in mine:
            try:
                found.setdefault(pid, (Path("/proc", str(pid), "cmdline").read_bytes().replace(b"\0", b" ")).decode())
            except OSError:
                continue
    return {p: c for p, c in found.items() if p not in mine}


def stop_head(temp_dir: Path, pgid: int | None = None) -> None:
    """End every process of the head of `temp_dir` and check that none is left; RuntimeError naming
    those that are. SIGTERM to all but the GCS, then to all and their process groups, then SIGKILL,
    each followed by up to STOP_GRACE_S for them to go. The GCS goes last: given SIGTERM together
    with its raylet it waits ~10 s for it, once the raylet is gone it exits in ~2 s."""
    for sig, spare_gcs in ((signal.SIGTERM, True), (signal.SIGTERM, False), (signal.SIGKILL, False)):
        procs = head_processes(temp_dir, pgid)
        if spare_gcs:
            procs = {p: c for p, c in procs.items() if _comm(p) != "gcs_server"}
        else:  # and every member of their groups, started meanwhile
            for group in {_pgid(p) for p in procs} - {None, os.getpgrp(), 0, 1}:
                try:
                    os.killpg(group, sig)  # type: ignore[arg-type]
                except OSError:
                    pass
        for pid in procs:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and set(procs) & set(head_processes(temp_dir, pgid)):
            time.sleep(0.1)
    left = head_processes(temp_dir, pgid)
    if left:
        listing = "\n".join(f"  {p}: {c[:200]}" for p, c in sorted(left.items()))
        raise RuntimeError(f"processes of the Ray head in {temp_dir} survived SIGKILL:\n{listing}")


def _comm(pid: int) -> str:
    try:
        return Path("/proc", str(pid), "comm").read_text().strip()
    except OSError:
        return ""


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def start_head(temp_dir: Path, cpus: int = 2) -> tuple[RayHead, int]:
    """`ray start --head` on free ports with `temp_dir`, waited for until its job API answers: the
    head and the process group of its processes. On failure everything it started is stopped and a
    RuntimeError carries `ray start`'s output and the logs."""
    ports = free_ports(len(PORT_FLAGS))
    first, last = free_range(WORKER_PORTS, set(ports))
    port = dict(zip(PORT_FLAGS, ports))
    head = RayHead(
        address=f"127.0.0.1:{port['--port']}", dashboard=f"127.0.0.1:{port['--dashboard-port']}", temp_dir=temp_dir
    )
    cmd = [
        ray_command(),
        "start",
        "--head",
        f"--num-cpus={cpus}",
        "--num-gpus=0",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        "--include-dashboard=true",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
        # the object store: Ray's default is 30% of the memory, on a machine others share
        "--object-store-memory=200000000",
        *(f"{flag}={p}" for flag, p in port.items()),
        f"--min-worker-port={first}",
        f"--max-worker-port={last}",
    ]
    # its own session and process group (the group of every daemon it starts, whose id stop_head
    # kills), started in the temp folder so that processes which rename themselves still name it by
    # their working directory; the venv's bin first, so that a job's `python3` is this interpreter
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    env.pop("RAY_ADDRESS", None)  # ray start --head refuses to run when it names another cluster
    proc = subprocess.Popen(
        cmd,
        cwd=temp_dir,
        env=env,
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pgid = proc.pid
    try:
        out, _ = proc.communicate(timeout=START_TIMEOUT_S)
        if proc.returncode != 0:
            raise RuntimeError(f"`ray start --head` failed (exit {proc.returncode}):\n{out}")
        _wait_for_jobs_api(head, time.monotonic() + START_TIMEOUT_S)
    except BaseException as e:
        stop_head(temp_dir, pgid)
        if isinstance(e, subprocess.TimeoutExpired):
            raise RuntimeError(f"`ray start --head` took longer than {START_TIMEOUT_S}s") from e
        if isinstance(e, RuntimeError):
            raise RuntimeError(f"{e}\n{head.logs()}") from e
        raise
    return head, pgid


def _wait_for_jobs_api(head: RayHead, deadline: float) -> None:
    from ray.job_submission import JobSubmissionClient

    error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            JobSubmissionClient(f"http://{head.dashboard}").list_jobs()
            return
        except Exception as e:  # connection refused, 503 while the job module starts
            error = e
            time.sleep(0.5)
    raise RuntimeError(f"the job API of the Ray dashboard at {head.dashboard} did not answer: {error}")


@pytest.fixture(scope="session")
def ray_head(request: pytest.FixtureRequest) -> Iterator[RayHead]:
    """A Ray head of its own for the session, on free ports, stopped by its own PIDs."""
    try:
        import ray.job_submission  # noqa: F401  (the dashboard's job API: ray[default])
    except ImportError as e:
        reason = f"the Ray tests need Ray with its dashboard (pip install 'ray[default]'): {e}"
        if _ci():
            pytest.fail(f"CI is set, so the Ray tests must run, but: {reason}", pytrace=False)
        pytest.skip(reason)
    # short: Ray's unix sockets live under it (at most ~107 characters each)
    temp_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    try:
        head, pgid = start_head(temp_dir, int(os.environ.get("SWEEP_TEST_RAY_CPUS", "2")))
    except RuntimeError as e:
        shutil.rmtree(temp_dir, ignore_errors=True)
        pytest.fail(str(e), pytrace=False)
    print(f"Ray head: GCS {head.address}, dashboard {head.dashboard}, temp dir {temp_dir}")
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            stop_head(temp_dir, pgid)
            shutil.rmtree(temp_dir, ignore_errors=True)

    request.session.stash[_STOP] = stop
    try:
        yield head
    finally:
        stop()


_STOP = pytest.StashKey[Callable[[], None]]()


def _uses_ray(item: pytest.Item) -> bool:
    """As tests/conftest.py groups them: the `ray` mark, or the fixture by name."""
    return item.get_closest_marker("ray") is not None or "ray_head" in getattr(item, "fixturenames", ())


def _ray_later(item: pytest.Item, nextitem: pytest.Item | None) -> bool:
    """Whether a test after `item` in this process may still use the head. Under `pytest -n 2 --dist
    loadgroup` the Ray tests are one group, run one after another by one worker, so the next test says
    it; under xdist's other schedules nothing says it (assume so); in one process, every later test."""
    if nextitem is not None and _uses_ray(nextitem):
        return True
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is not None:
        return "sweep_groups_dir" not in workerinput
    items = item.session.items
    return any(_uses_ray(later) for later in items[items.index(item) + 1 :])


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After the last test that uses the head (its own fixtures already torn down), stop it."""
    stop = item.session.stash.get(_STOP, None)
    if stop is not None and _uses_ray(item) and not _ray_later(item, nextitem):
        stop()
