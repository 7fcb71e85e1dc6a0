"""The real engines the torchx launcher's tests run against, checked on their own: a 2-replica torchx
app on the session's Ray head (tests/ray_cluster.py) and on its private Docker daemon
(tests/docker_daemon.py), where replica 1 reaches replica 0 over TCP by `TORCHX_RANK0_HOST`; and
each engine's stop, on a throwaway instance beside the session's: nothing of it is left, and the
other instance runs on untouched.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.docker_daemon import (
    DockerDaemon,
    docker,
    ensure_image,
    leftovers,
    python_mounts,
    start_daemon,
    stop_daemon,
)
from tests.ray_cluster import RayHead, head_processes, start_head, stop_head

ROOT = Path(__file__).resolve().parents[2]
APP_TIMEOUT_S = 180
RAY_DEFAULT_PORTS = {6379, 8265, 10001, 52365}  # GCS, dashboard, client server, dashboard agent


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _torchx() -> Any:
    """torchx's runner and specs (skipped without torchx, failed under CI)."""
    try:
        from torchx import specs
        from torchx.runner import get_runner
    except ImportError as e:
        if _ci():
            pytest.fail(f"CI is set, so the engine tests must run, but torchx is missing: {e}", pytrace=False)
        pytest.skip(f"torchx is not installed: {e}")
    return get_runner, specs


def _run_app(app: Any, scheduler: str, cfg: dict[str, Any]) -> tuple[str, str, dict[int, str], float]:
    """Run `app` to its end: (handle, final state, each replica's log, seconds from submit to end)."""
    get_runner, _ = _torchx()
    with get_runner() as runner:
        t0 = time.monotonic()
        handle = runner.run(app, scheduler=scheduler, cfg=cfg)
        deadline = t0 + APP_TIMEOUT_S
        while True:
            status = runner.status(handle)
            if status is not None and status.is_terminal():
                break
            assert time.monotonic() < deadline, f"{handle} still {status} after {APP_TIMEOUT_S}s"
            time.sleep(0.2)
        seconds = time.monotonic() - t0
        role = app.roles[0].name
        logs = {i: "".join(runner.log_lines(handle, role, i)) for i in range(app.roles[0].num_replicas)}
    return handle, str(status.state), logs, seconds


# ------------------------------------------------------------------------------------------- Ray


def _listening_ports(pids: set[int]) -> set[int]:
    """The TCP ports the processes `pids` listen on (from /proc: their sockets in LISTEN state)."""
    inodes: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                inodes[fields[9]] = int(fields[1].rsplit(":", 1)[1], 16)
    ports = set()
    for pid in pids:
        try:
            links = [os.readlink(f) for f in Path("/proc", str(pid), "fd").iterdir()]
        except OSError:
            continue
        ports |= {inodes[m[1]] for link in links if (m := re.fullmatch(r"socket:\[(\d+)\]", link)) and m[1] in inodes}
    return ports


# each replica writes where rank 0 is to a file of its own (Ray runs it on this host), and prints it;
# then waits: Ray relays a replica's output to the job's log through a pipe of its worker, and drops
# what the worker has not written out when the job ends and its workers are killed
ECHO = """
import os, sys, time
replica, folder, rank0 = sys.argv[1], sys.argv[2], os.environ["TORCHX_RANK0_HOST"]
open(os.path.join(folder, f"replica-{replica}"), "w").write(rank0)
print(f"replica {replica} of 2, rank 0 at {rank0}", flush=True)
time.sleep(2)
"""


@pytest.mark.ray
@pytest.mark.slow
def test_ray_runs_a_two_replica_torchx_app(ray_head: RayHead, tmp_path: Path) -> None:
    _, specs = _torchx()
    # the "image" of torchx's ray scheduler is a folder uploaded as the job's working directory
    # (and deleted by torchx after the upload, being under /tmp)
    image = tempfile.mkdtemp(prefix="sweep-test-ray-image-")
    role = specs.Role(
        name="echo",
        image=image,
        entrypoint="python3",
        args=["-c", ECHO, specs.macros.replica_id, str(tmp_path)],
        num_replicas=2,
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
    )
    handle, state, logs, seconds = _run_app(
        specs.AppDef(name="echo", roles=[role]), "ray", {"dashboard_address": ray_head.dashboard}
    )
    print(f"Ray: 2-replica app {handle} {state} in {seconds:.1f}s")
    assert state == "SUCCEEDED", f"{handle}: {state}\n{logs}\n{ray_head.logs()}"
    for replica in (0, 1):
        assert (tmp_path / f"replica-{replica}").read_text(), f"replica {replica} saw no TORCHX_RANK0_HOST"
    # the job's log (torchx gives it for every replica) shows both
    log = "\n".join(logs.values())
    for replica in (0, 1):
        assert re.search(rf"replica {replica} of 2, rank 0 at \S+", log), f"no line of replica {replica}:\n{log}"
    # the job ran on this head: its job API knows it, finished
    from ray.job_submission import JobStatus, JobSubmissionClient

    jobs = {j.submission_id: j.status for j in JobSubmissionClient(f"http://{ray_head.dashboard}").list_jobs()}
    job_id = handle.split(f"{ray_head.dashboard}-", 1)[1]  # ray://torchx/DASHBOARD-JOB_ID
    assert jobs.get(job_id) == JobStatus.SUCCEEDED, f"{job_id} not SUCCEEDED among the head's jobs {jobs}"


@pytest.mark.ray
def test_ray_head_listens_on_its_own_ports_only(ray_head: RayHead) -> None:
    procs = head_processes(ray_head.temp_dir)
    ports = _listening_ports(set(procs))
    gcs, dashboard = (int(a.rsplit(":", 1)[1]) for a in (ray_head.address, ray_head.dashboard))
    assert {gcs, dashboard} <= ports, f"GCS {gcs} / dashboard {dashboard} not among the head's ports {sorted(ports)}"
    # none of Ray's fixed defaults: another head on this machine (or a second test session) may hold them
    assert not ports & RAY_DEFAULT_PORTS, f"the head took Ray's default ports {sorted(ports & RAY_DEFAULT_PORTS)}"
    assert len(str(ray_head.temp_dir)) <= 20  # its unix sockets lie some 60 characters below it


@pytest.mark.ray
@pytest.mark.slow
def test_ray_stop_ends_its_own_head_only(ray_head: RayHead) -> None:
    """A second head, started and stopped beside the session's: none of its processes is left, and
    every process of the session's head still runs (a `ray stop` would have ended both)."""
    # its daemons (GCS, raylet, dashboard, monitors: they name its folder); its workers come and go
    session = {p for p, cmd in head_processes(ray_head.temp_dir).items() if str(ray_head.temp_dir) in cmd}
    assert len(session) >= 4, session
    temp_dir = Path(tempfile.mkdtemp(prefix="rt-", dir="/tmp"))
    try:
        t0 = time.monotonic()
        other, pgid = start_head(temp_dir, cpus=1)
        started = time.monotonic() - t0
        ours = set(head_processes(temp_dir, pgid))
        assert ours and not ours & session, "the two heads share processes"
        assert other.address != ray_head.address and other.dashboard != ray_head.dashboard
        t0 = time.monotonic()
        stop_head(temp_dir, pgid)
        print(f"Ray: a head started in {started:.1f}s, stopped in {time.monotonic() - t0:.1f}s")
    finally:
        stop_head(temp_dir)
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)
    assert not head_processes(temp_dir), "processes of the stopped head are left"
    assert not [p for p in ours if Path("/proc", str(p)).exists()], "a pid of the stopped head still runs"
    assert session <= set(head_processes(ray_head.temp_dir)), "stopping one head ended processes of the other"
    from ray.job_submission import JobSubmissionClient

    JobSubmissionClient(f"http://{ray_head.dashboard}").list_jobs()  # the session's head still answers


# ---------------------------------------------------------------------------------------- Docker

# replica 0 listens, replica 1 connects to it by TORCHX_RANK0_HOST (the container name, resolved by
# the network's DNS) and sends a line; each then shows where it imported the project from
RENDEZVOUS = r"""
import os, socket, sys, time
replica, rank0 = int(sys.argv[1]), os.environ["TORCHX_RANK0_HOST"]
if replica == 0:
    server = socket.create_server(("", 29511))
    server.settimeout(60)
    conn, (peer, _) = server.accept()
    print(f"replica 0 heard {conn.makefile().readline().strip()!r} from {peer}", flush=True)
else:
    for _ in range(300):
        try:
            conn = socket.create_connection((rank0, 29511), timeout=2)
            break
        except OSError:
            time.sleep(0.2)
    conn.sendall(b"hello from replica 1\n")
    print(f"replica 1 reached {rank0}", flush=True)
import sweeper
print(f"sweeper from {sweeper.__file__}", flush=True)
"""


@pytest.mark.docker
@pytest.mark.slow
def test_docker_two_replicas_meet_over_tcp(docker_daemon: DockerDaemon) -> None:
    _, specs = _torchx()
    role = specs.Role(
        name="meet",
        image=docker_daemon.image,
        entrypoint=sys.executable,
        args=["-c", RENDEZVOUS, specs.macros.replica_id],
        num_replicas=2,
        env={"PYTHONPATH": str(ROOT)},
        # torchx's mount strings, split into its options as its CLI does
        mounts=specs.parse_mounts([opt for m in docker_daemon.mounts for opt in m.split(",")]),
        resource=specs.Resource(cpu=1, gpu=0, memMB=512),
    )
    assert os.environ["DOCKER_HOST"] == docker_daemon.host  # torchx's docker client finds the daemon by it
    handle, state, logs, seconds = _run_app(specs.AppDef(name="meet", roles=[role]), "local_docker", {})
    print(f"Docker: 2-replica app {handle} {state} in {seconds:.1f}s")
    assert state == "SUCCEEDED", f"{handle}: {state}\n{logs}\n{docker_daemon.logs()}"
    assert re.search(r"replica 0 heard 'hello from replica 1' from 10\.213\.\d+\.\d+", logs[0]), logs[0]
    assert re.search(r"replica 1 reached \S+-meet-0\b", logs[1]), logs[1]
    for replica in (0, 1):  # the project came in through the bind mounts
        assert f"sweeper from {ROOT}/sweeper/__init__.py" in logs[replica], logs[replica]


def test_python_mounts_drop_nested_paths(tmp_path: Path) -> None:
    mounts = python_mounts(Path("/usr/lib/some/project"))
    assert "type=bind,src=/usr,dst=/usr,readonly" in mounts
    assert not any("/usr/lib/some/project" in m for m in mounts)  # inside /usr: already there
    assert len(mounts) == len(set(mounts))
    project = python_mounts(tmp_path)
    assert f"type=bind,src={tmp_path},dst={tmp_path},readonly" in project


def _iptables() -> str:
    """The rules, without iptables-save's comments and counters."""
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=True).stdout
    return "\n".join(re.sub(r"\[\d+:\d+\]", "[-]", line) for line in out.splitlines() if not line.startswith("#"))


def _links() -> set[str]:
    return set(os.listdir("/sys/class/net"))


def _bridges() -> set[str]:
    return {link for link in _links() if Path("/sys/class/net", link, "bridge").exists()}


def _dockers_links(before: set[str]) -> set[str]:
    """The links made since `before` that a Docker daemon makes: bridges, and the veths it names
    `veth<hex>` (a container's host end). Only these: the namespaces' cluster of the SLURM group, on
    the other xdist worker, makes and removes veths of its own (`sw-ctl<k>`) while this test runs."""
    return {link for link in _links() - before if link in _bridges() or link.startswith("veth")}


@pytest.fixture
def throwaway_base() -> Iterator[Path]:
    """A DOCKER_BASE of its own beside the session's (short: containerd's sockets lie under it)."""
    if os.geteuid() != 0:
        if _ci():
            pytest.fail("CI is set, so the Docker tests must run, but they need root", pytrace=False)
        pytest.skip("starting a Docker daemon needs root")
    base = Path(tempfile.mkdtemp(prefix="swdk-", dir="/tmp"))
    yield base
    stop_daemon(base, purge=True, DOCKER_ADDRESS_POOL="10.214.0.0/16")


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("daemon_killed", [False, True], ids=["stopped", "after-kill-9"])
def test_docker_stop_leaves_nothing(docker_daemon: DockerDaemon, throwaway_base: Path, daemon_killed: bool) -> None:
    """A second daemon with a container on a user-defined network, stopped with `stop.sh --purge`
    (after dockerd was SIGKILLed: its containerd, shim and container outlive it): no process, bridge,
    mount, iptables rule or file of it is left, and the session's daemon still answers."""
    base, pool = throwaway_base, {"DOCKER_ADDRESS_POOL": "10.214.0.0/16"}
    rules, links, bridges = _iptables(), _links(), _bridges()
    t0 = time.monotonic()
    host = start_daemon(base, **pool)
    started = time.monotonic() - t0
    pid = int((base / "dockerd.pid").read_text())
    assert start_daemon(base, **pool) == host and int((base / "dockerd.pid").read_text()) == pid  # reused
    image = ensure_image(host)
    net = docker(host, "network", "create", "meet").strip()
    container = docker(
        host, "run", "-d", "--network", "meet", "--mount", "type=bind,src=/usr,dst=/usr,readonly", image, "sleep", "600"
    ).strip()
    inner = int(docker(host, "inspect", "-f", "{{.State.Pid}}", container))
    # no bridge of the machine is gone: dockerd 20.10 with --bridge=none deletes any docker0 at start
    assert bridges <= _bridges(), f"bridges gone: {bridges - _bridges()}"
    made = _bridges() - bridges
    bridge = "swd" + hashlib.sha256(str(base).encode()).hexdigest()[:8]  # start.sh's default bridge
    assert made == {f"br-{net[:12]}", bridge}, made
    if daemon_killed:
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        assert Path("/proc", str(inner)).exists(), "the container should outlive a killed dockerd"
    t0 = time.monotonic()
    print(stop_daemon(base, purge=True, **pool))
    print(f"Docker: a daemon started in {started:.1f}s, stopped in {time.monotonic() - t0:.1f}s")

    assert not Path("/proc", str(inner)).exists(), "the container's process is left"
    assert not leftovers(base), f"processes of {base} are left: {leftovers(base)}"
    assert not _dockers_links(links), f"links left: {_dockers_links(links)}"
    assert bridges <= _bridges(), f"bridges gone: {bridges - _bridges()}"
    assert not [m for m in Path("/proc/self/mountinfo").read_text().splitlines() if f" {base}/" in m]
    assert _iptables() == rules, "iptables differ from before the daemon started"
    assert not base.exists(), f"{base} is left: {list(base.iterdir())}"
    docker(docker_daemon.host, "info")  # the session's daemon was not touched
