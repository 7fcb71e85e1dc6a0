"""The fork server the local launcher keeps warm across a sweep's trials (`forking.WarmZygote`): each launch
that names it has its zygote forked from it, in the launch's own terms (logs, sessions, start, the variables
read at use), unless its environment differs from the server's in another; a launch's zygote and ranks end
with the launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from sweeper.cli.trial import layout_from_sets
from sweeper.launchers.base import JobOutcome, TrialJob
from sweeper.launchers.forking import WarmZygote
from sweeper.launchers.local import LocalLauncher
from sweeper.launchers.ranks import launch
from sweeper.process import SERVER_VAR, alive
from sweeper.spec.loader import load_sweep
from tests.faults.helpers import rank_pids, wait_for

ROOT = Path(__file__).resolve().parents[2]
REPORT = {"kind": "call", "target": "tests.ranks_targets:report_start", "kwargs": {}}


@pytest.fixture
def warm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the server's environment: its launches' targets import
    server = WarmZygote(tmp_path)
    yield server
    server.close()
    assert not server.folder.exists() and not alive(server.proc.pid)


def _started(folder: Path) -> list[dict[str, object]]:
    return [json.loads((folder / "out" / f"start{r}.json").read_text()) for r in (0, 1)]


def test_each_launch_has_a_zygote_forked_by_the_warm_server(
    warm: WarmZygote, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    server = Path(f"/proc/{warm.proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    for n in (1, 2):  # two launches, one server: the second finds it as the first left it
        folder = tmp_path / f"launch{n}"
        asked = time.time()
        done = launch(REPORT, nprocs=2, timeout_s=120, workdir=folder, extra_env=warm.environ())
        assert done.returncodes == [0, 0] and not done.timed_out, done.log_tail(0)
        for r, got in enumerate(_started(folder)):
            # a child of a zygote forked by the server (which has the server's command line), in a
            # session of its own, writing to its own log, its start-up counted from when the launch asked
            assert got["parent"] == server and got["own_session"] and got["rank"] == str(r)
            assert got["stdout"] == str(folder / "logs" / f"rank{r}.log")
            assert asked <= float(got["started"]) <= time.time()
    assert "did not take" not in capfd.readouterr().err


def test_a_launch_whose_environment_differs_starts_a_zygote_of_its_own(
    warm: WarmZygote, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # torch read the server's environment at its import: a launch with another instruction set must not
    # run on it (the parity launches set ATEN_CPU_CAPABILITY for their ranks)
    env = warm.environ() | {"ATEN_CPU_CAPABILITY": "default"}
    done = launch(REPORT, nprocs=2, timeout_s=120, workdir=tmp_path / "own", extra_env=env)
    assert done.returncodes == [0, 0], done.log_tail(0)
    assert all(f"sweeper.runtime.zygote {tmp_path / 'own'}" in s["parent"] for s in _started(tmp_path / "own"))
    err = capfd.readouterr().err
    assert "warm zygote did not take this launch" in err and "ATEN_CPU_CAPABILITY" in err


def test_a_launch_that_differs_only_in_what_is_read_at_use_is_served(
    warm: WarmZygote, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # where caches and scratch files go, the tool's own settings: each test of a session has its own, and
    # its launches are served by the session's server (tests/conftest.py), each rank in the launch's values;
    # so is a private dockerd's socket (tests/docker_daemon.py names it in its worker's environment: every
    # launch of that worker after a Docker test started a zygote of its own, importing torch, until it was here),
    # and the address inductor sets in a process that loaded a compiled kernel (every launch of a test worker
    # after its first in-process compile started a zygote of its own: some 30 a run, about 5 s of CPU each);
    # so are the CUDA allocator's settings, which `sweep selftest` sets in its own process, and the terminal's
    # size (a test of `sweep trial` sets it: each started a zygote of its own)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    mine = {
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "TMPDIR": str(scratch),
        "DOCKER_HOST": f"unix://{tmp_path / 'docker.sock'}",
        "SWEEP_NOTE": "this launch's",
        "_TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR": "140000000000",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "COLUMNS": "211",
        "LINES": "47",
    }
    assert all(os.environ.get(k) != v for k, v in mine.items())  # the server's environment has others
    done = launch(REPORT, nprocs=2, timeout_s=120, workdir=tmp_path / "mine", extra_env=warm.environ() | mine)
    assert done.returncodes == [0, 0], done.log_tail(0)
    server = Path(f"/proc/{warm.proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    for got in _started(tmp_path / "mine"):
        assert got["parent"] == server and got["read_at_use"] == mine and got["tempdir"] == str(scratch)
    assert "did not take" not in capfd.readouterr().err


def test_a_killed_launcher_takes_its_zygote_and_ranks_with_it(warm: WarmZygote, tmp_path: Path) -> None:
    trial = tmp_path / "trial"  # laid out as a local trial's folder: its ranks write to ranks/logs
    script = (
        "import sys; from pathlib import Path; from sweeper.launchers.ranks import launch; "
        "task = {'kind': 'call', 'target': 'tests.ranks_targets:wait_for_file', 'kwargs': {'path': sys.argv[2]}}; "
        "launch(task, nprocs=2, timeout_s=300, workdir=Path(sys.argv[1]))"
    )
    env = os.environ | warm.environ()
    never = tmp_path / "never"
    proc = subprocess.Popen([sys.executable, "-c", script, str(trial / "ranks"), str(never)], env=env)
    try:
        ranks = wait_for(lambda: len(rank_pids(trial)) == 2 and rank_pids(trial), timeout=120, what="two ranks")
        zygote = int(Path(f"/proc/{ranks[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert alive(zygote) and zygote != warm.proc.pid
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    wait_for(lambda: not any(alive(p) for p in [*ranks, zygote]), timeout=20, what="the zygote and ranks to end")
    assert alive(warm.proc.pid)  # the server serves the sweep's next trial


def _one_trial(launcher: LocalLauncher, tmp_path: Path) -> tuple[JobOutcome, Path]:
    """One trial of the tiny CPU sweep (2 steps) through `launcher`, polled to its end: its outcome and log."""
    spec = yaml.safe_load((ROOT / "search_spaces" / "tiny_cpu.yaml").read_text())
    spec["trial"].update(steps=2, warmup_steps=1)
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(spec))
    layout = layout_from_sets(load_sweep(tmp_path / "tiny.yaml"), [])  # each knob's first value, as `sweep trial`
    job = TrialJob(0, layout, tmp_path / "tiny.yaml", tmp_path / "jobs" / "trial-0", timeout_s=120)
    handle = launcher.submit(job)
    deadline = time.time() + 120
    while (done := launcher.poll(handle)) is None and time.time() < deadline:
        time.sleep(0.2)
    assert done is not None, "the trial did not end in 120 s"
    return done, job.workdir / "log.txt"


def test_a_sweep_whose_caller_keeps_a_server_has_its_trials_served_by_it(
    warm: WarmZygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a caller running several sweeps (a script, a test session) keeps one server warm across them: a sweep
    # whose environment names it starts none of its own, and its end leaves it for the caller's next sweep
    monkeypatch.setenv(SERVER_VAR, warm.environ()[SERVER_VAR])
    launcher = LocalLauncher()
    done, log = _one_trial(launcher, tmp_path)
    assert launcher.warm is None  # it started no server of its own
    launcher.close()
    assert done.result.status == "ok", done
    assert alive(warm.proc.pid) and "did not take" not in log.read_text()


def test_a_sweep_the_callers_server_would_not_take_keeps_its_own(
    warm: WarmZygote, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # asked before the first trial: a server that would refuse every trial (each then importing torch in a
    # zygote of its own) is left for one of the sweep's own, which takes them all
    monkeypatch.setenv(SERVER_VAR, warm.environ()[SERVER_VAR])
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    launcher = LocalLauncher()
    done, log = _one_trial(launcher, tmp_path)
    assert launcher.warm is not None
    launcher.close()
    assert done.result.status == "ok", done
    assert "did not take" not in log.read_text()
    err = capfd.readouterr().err
    assert "would not take its launches" in err and "ATEN_CPU_CAPABILITY" in err, err
