"""The local launcher finds a trial process by its folder, and a restart ends the ones no record names.

Real processes: a stand-in `sweep trial` (its command line is what the launcher reads) that forks a
child without exec, as `subprocess.Popen(preexec_fn=...)` does for each rank while the rank's
preexec function runs: the child shows its parent's command line until it execs.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sweeper.launchers.base import TrialJob
from sweeper.launchers.local import LocalLauncher, trial_processes
from sweeper.layouts.layout import Layout
from sweeper.process import kill_group
from tests.faults.helpers import alive

# forks once, says the child's pid, then both wait (the child as a rank between fork and exec would)
FORKS = "import os, sys, time\npid = os.fork()\nif pid:\n    print(pid, flush=True)\ntime.sleep(120)\n"


@pytest.fixture
def trial(tmp_path: Path) -> Iterator[tuple[Path, Path, subprocess.Popen[str], int]]:
    jobs = tmp_path.resolve() / "jobs"
    workdir = jobs / "trial-00000-a1"
    (workdir / "ranks").mkdir(parents=True)
    cmd = [sys.executable, "-c", FORKS, "sweeper.cli", "trial", "--workdir", str(workdir / "ranks")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())  # the fork has happened: both processes exist
        yield jobs, workdir, proc, child
    finally:
        kill_group(proc.pid)
        proc.wait(timeout=30)


def test_a_trial_forking_a_rank_is_found_as_the_parent(trial):
    jobs, workdir, proc, child = trial
    assert alive(child) and child != proc.pid
    assert trial_processes(jobs) == {workdir: proc.pid}
    # what a restart records for a trial whose job id was never saved
    job = TrialJob(0, Layout(), workdir / "sweep.yaml", workdir, timeout_s=60)
    assert LocalLauncher().find(job) == f"local-{proc.pid}"


def test_a_restart_ends_the_stray_not_its_forked_child_and_returns_once_it_is_gone(trial):
    jobs, workdir, proc, child = trial
    assert LocalLauncher().end_strays(jobs, {workdir}) == []  # named by a record: left running
    assert alive(proc.pid) and alive(child)
    assert LocalLauncher().end_strays(jobs, set()) == [f"local-{proc.pid} (trial-00000-a1)"]
    assert not alive(proc.pid) and not alive(child)  # killed and gone by the time it returns


# blanks its own command line for a moment (its argument strings zeroed in its memory, through
# /proc/self/mem), as the kernel shows a process whose exec is under way: /proc/PID/cmdline reads empty
BLANKS = """
import sys, time
fields = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48 and 49 of proc(5))
with open("/proc/self/mem", "r+b", buffering=0) as mem:
    mem.seek(start)
    args = mem.read(end - start)
    mem.seek(start)
    mem.write(bytes(len(args)))
    print("blank", flush=True)
    time.sleep(float(sys.argv[1]))
    mem.seek(start)
    mem.write(args)
time.sleep(120)
"""


def test_reattach_waits_out_a_command_line_shown_empty(tmp_path: Path) -> None:
    workdir = tmp_path.resolve() / "jobs" / "trial-00000-a1"
    (workdir / "ranks").mkdir(parents=True)
    cmd = [sys.executable, "-c", BLANKS, "0.5", "sweeper.cli", "trial", "--workdir", str(workdir / "ranks")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "blank\n"
        assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().strip(b"\0") == b""  # what the launcher reads now
        job = TrialJob(0, Layout(), workdir / "sweep.yaml", workdir, timeout_s=60)
        found = LocalLauncher().reattach(f"local-{proc.pid}", job)  # no result yet: only the process says it is ours
        assert found is not None and found.job_id == f"local-{proc.pid}" and not found.info.get("ended")
    finally:
        kill_group(proc.pid)
        proc.wait(timeout=30)
