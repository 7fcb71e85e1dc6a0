"""Issue 12, items 1 and 2: a rank killed from outside is seen at once and retried once (never
called an OOM without evidence), and a trial never runs twice at once after `sweep run` is killed
around its start. Real `sweep run`, real trial processes and gloo ranks."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from sweeper.results.trial import STEPS_FILE
from sweeper.runtime.evidence import INFRASTRUCTURE_FAILURE, OomSigns, oom_evidence
from tests.faults.helpers import (
    alive,
    assert_no_processes_left,
    assert_rows_match_study,
    kill,
    processes_with,
    rank_pids,
    results,
    spec_file,
    start,
    wait_for,
)

pytestmark = pytest.mark.slow
ONE = {"tp": [1], "pp": [1, 2], "micro_batch_size": [1], "attention": ["flash2"]}


def inflight(root: Path, number: int = 0) -> dict | None:
    try:
        return json.loads((root / "inflight" / f"trial-{number:05d}.json").read_text())
    except (OSError, ValueError):
        return None


def trial_procs(root: Path) -> list[int]:
    """Live `sweep trial` processes (not ranks, nor a rank between fork and exec) of the sweep under `root`."""
    found = []
    for p in processes_with(str(root / "jobs")):
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if b"trial" in cmd and b"sweeper.cli" in cmd:
            found.append((p, ppid))
    pids = {p for p, _ in found}
    return sorted(p for p, ppid in found if ppid not in pids)


def freeze_trial(root: Path, frozen: list[int]) -> int:
    """Wait for trial 0's process and both its ranks, SIGSTOP them (added to `frozen`); its pid.

    Both ranks started: the trial forks no more, so no rank between fork and exec wears its
    command line."""
    trial = wait_for(lambda: trial_procs(root), timeout=180, what="the trial process")[0]
    trial_dir = root / "jobs" / "trial-00000-a1"
    ranks = wait_for(lambda: (p := rank_pids(trial_dir)) and len(p) == 2 and p, timeout=180, what="two ranks")
    for pid in (trial, *ranks):
        kill(pid, signal.SIGSTOP)
        frozen.append(pid)
    return trial


def test_oom_needs_evidence_that_names_the_rank():
    assert oom_evidence(1, "step 3 ok\nloss 1.2", OomSigns()) is None  # a bare SIGKILL is no OOM
    why = oom_evidence(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", OomSigns())
    assert why is not None and "OutOfMemoryError" in why
    # the cgroup's counter counts only when the cgroup held nothing but the trial (tests/faults/test_oom_attribution.py)
    shared = OomSigns(counter_rise=(2, 3), cgroup_shared="process 77 (python3)")
    assert oom_evidence(1, "", shared) is None and "also holds process 77 (python3)" in shared.note()
    assert oom_evidence(1, "", OomSigns(counter_rise=(2, 3))) == "the cgroup's oom_kill counter rose from 2 to 3"
    assert oom_evidence(5, "", OomSigns(killed_pids=frozenset({4}))) is None
    assert (
        oom_evidence(4, "", OomSigns(killed_pids=frozenset({4}))) == "the kernel log names pid 4 as killed for memory"
    )


def test_a_killed_rank_is_seen_at_once_retried_once_and_never_called_oom(tmp_path: Path):
    # 40 steps take about 12 s here, from the first step's end on; the 3-minute limit is never what ends a trial
    spec = spec_file(tmp_path, "rankkill", trial={"steps": 40, "timeout_min": 3}, search={"max_trials": 2}, space=ONE)
    root = results(tmp_path, "rankkill")
    proc = start("run", str(spec), cwd=tmp_path)
    killed_at = []
    try:
        for attempt, rank in ((1, 1), (2, 0)):  # rank 1 dies while rank 0 waits; then rank 0 itself
            trial_dir = root / "jobs" / f"trial-00000-a{attempt}"
            pids = wait_for(lambda d=trial_dir: (p := rank_pids(d)) and len(p) == 2 and p, timeout=90, what="two ranks")
            # both ranks past start-up, in the training loop's collectives: rank 0 wrote a step's time
            steps = trial_dir / "ranks" / "out" / STEPS_FILE
            wait_for(
                lambda f=steps: f.is_file() and f.read_text().count("\n") >= 1, timeout=90, what="a step", every=0.02
            )
            ordered = sorted(
                pids,
                key=lambda p: (
                    "RANK=0" not in Path(f"/proc/{p}/environ").read_bytes().decode(errors="replace").split("\0")
                ),
            )
            kill(ordered[rank])
            killed_at.append(time.time())
            wait_for(lambda ps=pids: not any(alive(p) for p in ps), timeout=60, what="the other rank to be ended")
        _, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    df = assert_rows_match_study(tmp_path, "rankkill").set_index("trial_number")
    first = df.loc[0]
    assert first.status == "failed" and first.attempt == 2, (first.status, first.error)
    assert first.error.startswith(INFRASTRUCTURE_FAILURE) and "rank 0 was killed by SIGKILL" in first.error, first.error
    assert f"(attempt 1: {INFRASTRUCTURE_FAILURE}: rank 1" in first.error, first.error
    assert "oom" not in set(df.status) and "timeout" not in set(df.status), df[["status", "error"]]
    assert df.loc[1].status == "ok"  # the sweep went on; no layout was excluded as an OOM
    # each death was seen within the exit grace (15 s), not at the 3-minute limit
    finished = first.finished_at.timestamp() if hasattr(first.finished_at, "timestamp") else 0
    assert finished - killed_at[1] < 60, (finished, killed_at)
    assert_no_processes_left(root)


def test_restart_finds_a_trial_whose_job_id_was_never_recorded(tmp_path: Path):
    # the trial's own limit counts the time it is held stopped below: generous, never what ends it
    spec = spec_file(tmp_path, "window", trial={"steps": 60, "timeout_min": 10}, search={"max_trials": 1}, space=ONE)
    root = results(tmp_path, "window")
    proc = start("run", str(spec), cwd=tmp_path)
    frozen: list[int] = []
    seen: set[int] = set()

    def one_at_most() -> None:
        now = trial_procs(root)
        seen.update(now)
        assert len(now) <= 1, f"two trial processes at once: {now}"

    try:
        # stopped until the restart has found it: left to run, the trial can finish before a restart
        # slowed by a loaded machine looks, which then collects its result file instead (job id local-0)
        trial = freeze_trial(root, frozen)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        rec = inflight(root)
        # the state a kill between saving the record and starting the process leaves behind
        (root / "inflight" / "trial-00000.json").write_text(json.dumps(rec | {"job_id": None}))
        again = start("run", str(spec), cwd=tmp_path)
        # the restart records the job id it found (or, wrongly, of a second start): then the trial goes on
        wait_for(
            lambda: one_at_most() or again.poll() is not None or (inflight(root) or {}).get("job_id"),
            timeout=300,
            what="the restart to record the trial's job id",
        )
        for pid in frozen:
            kill(pid, signal.SIGCONT)
        while again.poll() is None:
            one_at_most()
            time.sleep(0.2)
        _, err = again.communicate()
    finally:
        for p in (proc, locals().get("again")):
            if p is not None and p.poll() is None:
                p.kill()
        for pid in set(frozen) & set(processes_with(str(root))):  # left stopped by a failure above
            kill(pid)
    assert again.returncode == 0, err[-3000:]
    assert seen <= {trial}, f"the trial was started again: {seen} (first {trial})"
    df = assert_rows_match_study(tmp_path, "window")
    assert len(df) == 1 and df.iloc[0].status == "ok" and df.iloc[0].job_id == f"local-{trial}"
    log = (root / "jobs" / "trial-00000-a1" / "log.txt").read_text()
    assert log.count("trial window:") == 1, log  # launched once
    assert_no_processes_left(root)


def test_restart_ends_a_trial_process_that_no_record_names(tmp_path: Path):
    spec = spec_file(tmp_path, "stray", trial={"steps": 60, "timeout_min": 3}, search={"max_trials": 1}, space=ONE)
    root = results(tmp_path, "stray")
    proc = start("run", str(spec), cwd=tmp_path)
    frozen: list[int] = []
    try:
        # frozen until the restart ends it: left to run, the stray can finish before a restart slowed
        # by a loaded machine looks for it, and there is then no stray to end (SIGKILL ends a stopped process)
        stray = freeze_trial(root, frozen)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        (root / "inflight" / "trial-00000.json").unlink()  # as if killed before the record was saved
        again = start("run", str(spec), cwd=tmp_path)
        while again.poll() is None:
            assert len(trial_procs(root)) <= 1, "two trial processes at once"
            time.sleep(0.2)
        _, err = again.communicate()
    finally:
        for p in (proc, locals().get("again")):
            if p is not None and p.poll() is None:
                p.kill()
        for pid in set(frozen) & set(processes_with(str(root))):  # left stopped by a failure above
            kill(pid)
    assert again.returncode == 0, err[-3000:]
    assert not alive(stray)
    assert f"local-{stray}" in " ".join(err.split()) and "no record names" in " ".join(err.split()), err[-2000:]
    df = assert_rows_match_study(tmp_path, "stray")
    assert len(df) == 1 and df.iloc[0].status == "ok"
    assert_no_processes_left(root)
