"""A real local Docker daemon for the torchx launcher's `local_docker` tests: the session fixture `docker_daemon`.

Registered for the whole test suite by `pytest_plugins` in tests/conftest.py. A test that asks for
`docker_daemon` (and should be marked `@pytest.mark.docker`) gets a `DockerDaemon`: a private
dockerd (scripts/docker/start.sh: its own data root, socket, containerd namespaces, default bridge and
address pool, beside any other daemon of the machine) that answers on `host`, which is also
`DOCKER_HOST` for the session (the `sweep` subprocesses a test starts inherit it), and an image in
which a trial runs this machine's own Python.

The image holds no Python: it is an empty root made with `docker import` (no registry, no network):
`lib`, `lib64`, `bin` and `sbin` link into `usr`, empty `usr proc sys dev tmp root work`, and this
machine's /etc/passwd, /etc/group and /etc/ld.so.cache. A container runs the interpreter, the venv
and the project of the tests through the read-only bind mounts of `mounts` (torchx mount strings,
for `local_docker`'s `mounts=` or a role's `mounts`): /usr, the interpreter's base prefix, the venv
and the repository the tests run from.

At the end of the session the containers torchx made (label `torchx.pytorch.org/app-id`) are
removed and the daemon stopped with `stop.sh --purge` (its bridges, its iptables rule, its files).

Not root: the tests that use it are skipped, unless the environment variable CI is set (CI must
run them), in which case they fail. A start that fails as root always fails the tests.

Environment:
    SWEEP_TEST_DOCKER_BASE  the daemon's DOCKER_BASE (default /tmp/sweep-test-docker)
    SWEEP_TEST_DOCKER_KEEP  1: leave the daemon (and its image) running after the session (the next
                            session reuses it at once; stop it with DOCKER_BASE=... scripts/docker/stop.sh)
    DOCKER_ADDRESS_POOL     passed through to scripts/docker/start.sh
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "scripts" / "docker" / "start.sh"
STOP = ROOT / "scripts" / "docker" / "stop.sh"
DEFAULT_BASE = "/tmp/sweep-test-docker"
IMAGE_TAG = "sweep-test:local"
TORCHX_APP_LABEL = "torchx.pytorch.org/app-id"  # torchx's docker scheduler labels each container with it
START_TIMEOUT_S = 600  # a cold start installs docker.io (~20 s here, longer on a slow mirror)
STOP_TIMEOUT_S = 120


@dataclass(frozen=True)
class DockerDaemon:
    """The running daemon and the image a test's containers run in."""

    host: str  # DOCKER_HOST, e.g. "unix:///tmp/sweep-test-docker/docker.sock"
    base: Path  # DOCKER_BASE: data and exec roots, socket, pid file, dockerd.log
    image: str  # the image's id, "sha256:...": torchx pulls any other name first (a registry round trip)
    mounts: tuple[str, ...]  # torchx bind mounts that bring this machine's Python and the project in

    def logs(self, lines: int = 30) -> str:
        """The last `lines` of the daemon's log, to put in a failing test's message."""
        return daemon_log(self.base, lines)


def daemon_log(base: Path, lines: int = 30) -> str:
    """The last `lines` of the log of the daemon of `base` (and of its containerd)."""
    path = base / "dockerd.log"
    if not path.exists():
        return f"({path} is absent)"
    tail = path.read_text(errors="replace").splitlines()[-lines:]
    return f"==> {path} <==\n" + "\n".join(tail)


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _run(
    cmd: list[str], env: Mapping[str, str] | None = None, timeout: float = 60, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        cmd, env=None if env is None else dict(env), input=stdin, capture_output=True, timeout=timeout, check=False
    )
    # bytes in (a tar on stdin), text out
    return subprocess.CompletedProcess(
        out.args, out.returncode, out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace")
    )


def script_env(base: Path, **extra: str) -> dict[str, str]:
    """The environment of start.sh / stop.sh for the daemon of `base`."""
    return {**os.environ, "DOCKER_BASE": str(base), **extra}


def start_daemon(base: Path, **extra: str) -> str:
    """Start (or reuse) the daemon of `base`; its DOCKER_HOST. RuntimeError with start.sh's output if it fails."""
    done = _run(["bash", str(START)], script_env(base, **extra), START_TIMEOUT_S)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not lines[-1].startswith("DOCKER_HOST="):
        raise RuntimeError(f"{START} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    print(done.stdout, end="")  # shown with a failing test's report ("Captured stdout setup")
    return lines[-1].removeprefix("DOCKER_HOST=")


def stop_daemon(base: Path, purge: bool = True, **extra: str) -> str:
    """stop.sh [--purge] for the daemon of `base`; its output. RuntimeError if it fails, or if a
    process of the daemon is left (or, with `purge`, its folder)."""
    done = _run(["bash", str(STOP), *(["--purge"] if purge else [])], script_env(base, **extra), STOP_TIMEOUT_S)
    left = leftovers(base)
    if purge and base.exists():
        left.append(f"the folder {base}: {sorted(p.name for p in base.iterdir())}")
    if done.returncode != 0 or left:
        raise RuntimeError(f"{STOP} failed (exit {done.returncode}), left {left}:\n{done.stdout}{done.stderr}")
    return done.stdout


def leftovers(base: Path) -> list[str]:
    """The processes whose command line names a file under `base` (dockerd, its containerd, shims)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone meanwhile, or not a process
            continue
        if proc.name.isdigit() and f"{base}/" in cmdline:
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def docker(host: str, *args: str, timeout: float = 60, stdin: bytes | None = None) -> str:
    """`docker -H host ARGS`'s output; RuntimeError with its stderr if it fails."""
    done = _run(["docker", "-H", host, *args], timeout=timeout, stdin=stdin)
    if done.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def python_mounts(project: Path) -> tuple[str, ...]:
    """torchx bind mounts (read-only, same path inside) of what runs this machine's Python and
    `project`: /usr, the interpreter's base prefix, the venv, the project. A path inside another
    one is dropped (a bind mount of it is already in the outer one)."""
    paths = sorted({os.path.abspath(p) for p in ("/usr", sys.base_prefix, sys.prefix, project)}, key=len)
    kept: list[str] = []
    for path in paths:
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return tuple(f"type=bind,src={p},dst={p},readonly" for p in kept)


def image_tar() -> bytes:
    """The image's root, as a tar for `docker import`: links into /usr (bind-mounted at run time),
    the directories a container needs, and the files that name users and find libraries."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("usr", "proc", "sys", "dev", "tmp", "root", "work", "etc"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        for link in ("lib", "lib64", "bin", "sbin"):
            info = tarfile.TarInfo(link)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, f"usr/{link}", 0o777
            tar.addfile(info)
        # ld.so.cache: without it the loader searches only its built-in directories, not the
        # multiarch ones (/usr/lib/x86_64-linux-gnu) where Debian keeps most libraries
        for name in ("passwd", "group", "ld.so.cache"):
            source = Path("/etc", name)
            if source.exists():
                data = source.read_bytes()
                info = tarfile.TarInfo(f"etc/{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def ensure_image(host: str, tag: str = IMAGE_TAG) -> str:
    """The id ("sha256:...") of image `tag` in the daemon at `host`, imported first if missing."""
    present = docker(host, "image", "ls", "-q", "--no-trunc", tag).split()
    if present:
        return present[0]
    return docker(host, "import", "-", tag, stdin=image_tar()).strip()


def remove_torchx_containers(host: str) -> int:
    """Remove every container torchx made in the daemon at `host` (running or not); how many."""
    ids = docker(host, "ps", "-aq", "--filter", f"label={TORCHX_APP_LABEL}").split()
    if ids:
        docker(host, "rm", "-f", *ids, timeout=120)
    return len(ids)


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[DockerDaemon]:
    """A private dockerd for the session (scripts/docker/start.sh), DOCKER_HOST pointing at it."""
    if os.geteuid() != 0:
        reason = (
            "the Docker tests need root to start the project's private dockerd "
            "(scripts/docker/start.sh installs docker.io and starts dockerd); "
            "run pytest as root, or deselect them with -m 'not docker'"
        )
        if _ci():
            pytest.fail(f"CI is set, so the Docker tests must run, but: {reason}", pytrace=False)
        pytest.skip(reason)

    base = Path(os.environ.get("SWEEP_TEST_DOCKER_BASE", DEFAULT_BASE))
    keep = os.environ.get("SWEEP_TEST_DOCKER_KEEP", "") == "1"
    try:
        host = start_daemon(base)
        image = ensure_image(host)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        message = f"{e}\n{daemon_log(base)}"
        # stop what it did start (a half-started daemon would confuse the next session), logs kept
        try:
            stop_daemon(base, purge=False)
        except (RuntimeError, subprocess.TimeoutExpired) as stop_error:
            message += f"\nand stopping it failed too: {stop_error}"
        pytest.fail(message, pytrace=False)
    before = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = host
    try:
        yield DockerDaemon(host=host, base=base, image=image, mounts=python_mounts(ROOT))
    finally:
        if before is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = before
        remove_torchx_containers(host)
        if not keep:
            stop_daemon(base, purge=True)
