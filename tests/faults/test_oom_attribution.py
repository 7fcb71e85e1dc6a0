"""Issue 27, break 2: a SIGKILL from outside is not taken for an OOM on evidence that does not name
the rank. Real rank processes (`sweeper.launchers.ranks.launch`, run by tests/faults/oom_driver.py),
real signals, a real memory cgroup whose limit the kernel's OOM killer enforces, real records in
the kernel log (/dev/kmsg) and a real pid namespace (unshare). Root only: making a cgroup,
writing the kernel log, choosing a pid and entering a namespace all need it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweeper.process import SERVER_VAR
from sweeper.runtime.evidence import INFRASTRUCTURE_FAILURE
from tests.faults.helpers import alive, env_with, kill, rank_pids, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups, the kernel log and pid namespaces need root")
LIMIT = 256 << 20  # the test cgroup's memory: the driver and its light ranks use a fraction


def memory_cgroup_v1() -> Path | None:
    """This process's cgroup v1 memory folder (v2 cannot put processes in a child of a cgroup that has them)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            d = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return d if (d / "memory.oom_control").is_file() else None
    return None


def oom_kills(cgroup: Path) -> int:
    text = (cgroup / "memory.oom_control").read_text()
    return int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("oom_kill ")))


@pytest.fixture
def cgroup() -> Iterator[Path]:
    """A fresh memory cgroup of LIMIT bytes under ours, removed after the test."""
    parent = memory_cgroup_v1()
    if parent is None:
        pytest.skip("no cgroup v1 memory controller here")
    d = parent / f"sweep-test-{uuid.uuid4().hex[:8]}"
    try:
        d.mkdir()
        (d / "memory.limit_in_bytes").write_text(str(LIMIT))
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup: {e}")
    yield d
    for pid in (d / "cgroup.procs").read_text().split():
        kill(int(pid))
    wait_for(lambda: not (d / "cgroup.procs").read_text().split(), timeout=30, what="the test cgroup to empty")
    d.rmdir()


def start_driver(workdir: Path, *, pid_namespace: bool = False, **args: Any) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tests.faults.oom_driver", json.dumps({"workdir": str(workdir / "ranks"), **args})]
    if pid_namespace:  # a shell as the namespace's pid 1: a rank whose parent is pid 1 takes it for init and quits
        cmd = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", '"$@"; exit $?', "sh", *cmd]
    # its ranks are forked in its cgroup and pid namespace: by a zygote of the launch's own, not from the
    # session's fork server (tests/conftest.py), which is in neither
    env = {k: v for k, v in env_with().items() if k != SERVER_VAR}
    return subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(driver: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = driver.communicate(timeout=180)
    assert driver.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def rank_of(pid: int) -> int:
    """A rank's number, from the log its stdout goes to (`logs/rankN.log`): /proc/PID/environ shows the
    environment a process started with, which a rank forked by the zygote replaced after its start."""
    return int(Path(os.readlink(f"/proc/{pid}/fd/1")).stem.removeprefix("rank"))


def test_an_oom_kill_of_another_process_in_the_cgroup_is_not_the_killed_ranks(tmp_path: Path, cgroup: Path):
    """The issue's (a): a rank SIGKILLed from outside at the moment an unrelated process in the same
    memory cgroup is OOM-killed: the cgroup's counter rose, but it names no rank of this trial."""
    go, stop = tmp_path / "go", tmp_path / "stop"
    hog = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time, pathlib as p\n"
            f"p.Path({str(cgroup / 'cgroup.procs')!r}).write_text(str(os.getpid()))\n"
            "p.Path('/proc/self/oom_score_adj').write_text('1000')\n"
            f"while not p.Path({str(go)!r}).exists(): time.sleep(0.05)\n"
            "hoard = []\n"
            "while True: hoard.append(bytearray(16 << 20))\n",
        ]
    )
    driver = None
    try:
        wait_for(lambda: str(hog.pid) in (cgroup / "cgroup.procs").read_text().split(), timeout=30, what="the hog")
        driver = start_driver(
            tmp_path, cgroup=str(cgroup), nprocs=2, target="wait_for_file", kwargs={"path": str(stop)}
        )
        ranks = wait_for(lambda: (p := rank_pids(tmp_path)) and len(p) == 2 and p, timeout=60, what="two ranks")
        assert oom_kills(cgroup) == 0
        go.touch()  # the unrelated process runs the cgroup out of memory and is OOM-killed
        assert hog.wait(timeout=60) == -signal.SIGKILL
        assert oom_kills(cgroup) == 1
        rank1 = next(p for p in ranks if rank_of(p) == 1)
        kill(rank1)  # at that moment, someone else kills rank 1
        wait_for(lambda: not alive(rank1), timeout=30, what="rank 1 to die")
        stop.touch()  # rank 0 ends on its own
        result = finish(driver)
    finally:
        for p in (hog, driver):
            if p is not None and p.poll() is None:
                p.kill()
    assert result["returncodes"][1] == -signal.SIGKILL
    assert result["oom"] is None, result  # before: "the cgroup's oom_kill counter rose from 0 to 1"
    msg = result["unexplained"]
    assert msg.startswith(INFRASTRUCTURE_FAILURE) and "rank 1 was killed by SIGKILL" in msg, msg
    assert f"rose from 0 to 1, but the cgroup also holds process {hog.pid} (python" in msg, msg


def test_an_oom_kill_in_a_cgroup_of_this_trials_processes_alone_is_an_oom(tmp_path: Path, cgroup: Path):
    """The counter still counts when the cgroup held nothing but the trial: rank 1 runs it out of memory."""
    result = finish(start_driver(tmp_path, cgroup=str(cgroup), nprocs=2, target="eat_memory"))
    assert result["returncodes"] == [0, -signal.SIGKILL], result
    assert result["oom"] == [1, "the cgroup's oom_kill counter rose from 0 to 1"], result
    assert oom_kills(cgroup) == 1


def kmsg_writable() -> None:
    try:
        with open("/dev/kmsg", "w"):
            pass
    except OSError as e:
        pytest.skip(f"cannot write the kernel log: {e}")


def test_an_old_kernel_log_record_naming_the_ranks_pid_is_not_its_oom(tmp_path: Path, cgroup: Path):
    """The issue's (b): rank 0 gets a pid that an OOM record written before it started names, and is
    SIGKILLed from outside (here by itself): the record is older than the rank, so not its OOM."""
    kmsg_writable()
    result = finish(start_driver(tmp_path, cgroup=str(cgroup), nprocs=1, target="sigkill_self", old_line=True))
    assert result["returncodes"] == [-signal.SIGKILL], result
    assert result["oom"] is None, result  # before: "the kernel log names pid N as killed for memory"
    assert result["unexplained"].startswith(f"{INFRASTRUCTURE_FAILURE}: rank 0 was killed by SIGKILL"), result


@pytest.mark.parametrize("namespace", [False, True], ids=["host", "pid-namespace"])
def test_a_kernel_log_record_names_the_rank_only_in_the_kernels_pid_namespace(
    tmp_path: Path, cgroup: Path, namespace: bool
):
    """The issue's (b), second half: a new record naming the rank's pid is its OOM on the host; inside
    a pid namespace the rank's pid is not the one the kernel log would name, so it is not read there."""
    kmsg_writable()
    if namespace and shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    line = "Out of memory: Killed process {pid} (python3) total-vm:1000kB, anon-rss:1000kB"
    driver = start_driver(
        tmp_path,
        cgroup=str(cgroup),
        nprocs=1,
        target="sigkill_self",
        kwargs={"kernel_line": line},
        pid_namespace=namespace,
    )
    result = finish(driver)
    assert result["returncodes"] == [-signal.SIGKILL], result
    if namespace:
        assert result["pids"][0] < 100, result  # a namespace's own small pid, not the host's
        assert result["oom"] is None, result  # before: the namespace pid matched the record
    else:
        pid = result["pids"][0]
        assert result["oom"] == [0, f"the kernel log names pid {pid} as killed for memory"], result
