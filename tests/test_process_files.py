"""The shared helpers: atomic writes, result files, process groups, the search's scheduling policy."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from sweeper.files import atomic_write, atomic_write_text
from sweeper.launchers.process import free_port, kill_group, read_result
from sweeper.search import Schedule


def test_atomic_write_replaces_whole_and_leaves_nothing_on_failure(tmp_path):
    path = tmp_path / "f.json"
    atomic_write_text(path, "old")
    atomic_write_text(path, "new")
    assert path.read_text() == "new"

    def half_then_fail(tmp):
        tmp.write_text("partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_read_result_takes_the_object_after_stray_text_and_refuses_the_rest(tmp_path):
    p = tmp_path / "result.json"
    assert read_result(p) is None  # missing
    p.write_text('compile warning\n{"status": "ok", "mfu": 0.4}')
    assert read_result(p) == {"status": "ok", "mfu": 0.4}
    for text in ('{"mfu": 0.4}', '{"status": "ok"', "[1, 2]", ""):
        p.write_text(text)
        assert read_result(p) is None, text


def test_kill_group_ends_a_session_with_its_children():
    proc = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                            start_new_session=True)
    time.sleep(0.5)
    assert kill_group(proc.pid)
    assert proc.wait(timeout=10) == -9
    assert 0 < free_port() < 65536


@pytest.mark.parametrize("sampler,n,budget,exploits", [
    ("auto", 10, 20, [True] * 6),  # every candidate fits: best predicted first, always
    ("auto", 100, 20, [True] * 6),  # the search's own pick (expected improvement) every trial
    ("tpe", 100, 20, [False] * 6),
    ("grid", 100, 20, [True] * 6),
])
def test_schedule(sampler, n, budget, exploits):
    policy = Schedule.of(sampler, n_candidates=n, max_trials=budget)
    assert [policy.exploit(started=i) for i in range(6)] == exploits
    assert policy.in_plan_order is (sampler == "grid")
