"""sweeper/process: result files read back from a trial, process groups ended whole, free ports."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sweeper.process import alive, free_port, kill_group, read_result
from tests.conftest import cli_env


def test_read_result_takes_the_object_after_stray_text_and_refuses_the_rest(tmp_path):
    p = tmp_path / "result.json"
    assert read_result(p) is None  # missing
    p.write_text('compile warning\n{"status": "ok", "mfu": 0.4}')
    assert read_result(p) == {"status": "ok", "mfu": 0.4}
    for text in ('{"mfu": 0.4}', '{"status": "ok"', "[1, 2]", ""):
        p.write_text(text)
        assert read_result(p) is None, text


def test_kill_group_ends_a_session_with_its_children():
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)",
        ],
        start_new_session=True,
    )
    time.sleep(0.5)
    assert kill_group(proc.pid)
    assert proc.wait(timeout=10) == -9
    assert 0 < free_port() < 65536


def test_alive_tells_a_running_process_from_an_ended_or_zombie_one():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the child did not end"
        time.sleep(0.01)
    assert alive(os.getpid()) and not alive(child.pid)  # ended, not yet reaped: a zombie is not alive
    child.wait()
    assert not alive(child.pid) and not alive(2**40)  # reaped, and a pid no process can have


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_usable_cpus_counts_the_affinity_not_the_machine():
    """Issue 48: under `taskset -c 0` a profile recorded the machine's cores, and the local launcher
    sized OMP_NUM_THREADS by them, while its ranks were bound inside the affinity."""
    code = "import os; from sweeper.process import usable_cpus; print(usable_cpus(), os.cpu_count())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
        capture_output=True,
        text=True,
        env=cli_env(),
        check=True,
    ).stdout.split()
    assert out[0] == "1" and int(out[1]) >= 2, out
