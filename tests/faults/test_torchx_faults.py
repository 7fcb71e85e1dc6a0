"""The torchx launcher when its app is hit from outside, on the real engines (a local Ray head, a local
Docker daemon): a replica killed without leaving its report, and an app whose containers were removed,
are failures around the trial (retried once by the sweep); the trial's own failure is not.

The contract every launcher keeps runs in tests/launchers/test_contract.py; this file drives the
same harnesses.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from sweeper.statuses import TrialStatus
from tests.launchers.test_contract import HARNESSES, LONG_COMMAND, Bench, app_pids, outcome

ENGINES = [
    pytest.param("torchx-ray", marks=[pytest.mark.ray, pytest.mark.slow]),
    pytest.param("torchx-docker", marks=[pytest.mark.docker, pytest.mark.slow]),
]


@pytest.fixture(params=ENGINES)
def bench(request: pytest.FixtureRequest, tmp_path: Path) -> Bench:
    return Bench(request.param, tmp_path, request)


def _replica_pids(job_id: str) -> list[int]:
    """The replica processes of a torchx app on this host (Ray's actors run them here)."""
    return app_pids(job_id, b"sweeper.launchers.replica")


def _wait(check, within_s: float = 60) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert check()


def test_a_replica_killed_from_outside_is_a_failure_around_the_trial(bench: Bench) -> None:
    sweep = bench.sweep(LONG_COMMAND)
    launcher = bench.launcher(sweep)
    handle = launcher.submit(bench.job(sweep))
    _wait(lambda: HARNESSES[bench.engine].alive(handle))
    if bench.engine == "torchx-ray":
        _wait(lambda: bool(_replica_pids(handle.job_id)))
        for pid in _replica_pids(handle.job_id):
            os.kill(pid, signal.SIGKILL)  # as the kernel's OOM killer or a lost node would, leaving no report
    else:
        import docker

        app = handle.job_id.rsplit("/", 1)[-1]
        for container in docker.from_env().containers.list(filters={"label": f"torchx.pytorch.org/app-id={app}"}):
            container.kill()  # SIGKILL to the replica, PID 1 of its container
    done = outcome(launcher, handle, within_s=60)
    assert done.result.status == TrialStatus.FAILED and done.infrastructure_failure, done.result.error
    assert "without a result from node 0" in (done.result.error or "")
    _wait(lambda: not HARNESSES[bench.engine].alive(handle), 30)  # nothing of it runs on (`sleep 600` included)


@pytest.mark.docker
@pytest.mark.slow
def test_an_app_whose_containers_were_removed_has_vanished(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    # (a Ray job cannot be removed while it runs: Ray's head forgets nothing short of a restart)
    import docker

    bench = Bench("torchx-docker", tmp_path, request)
    sweep = bench.sweep(LONG_COMMAND)
    launcher = bench.launcher(sweep)
    handle = launcher.submit(bench.job(sweep))
    _wait(lambda: HARNESSES[bench.engine].alive(handle))
    app = handle.job_id.rsplit("/", 1)[-1]
    for container in docker.from_env().containers.list(filters={"label": f"torchx.pytorch.org/app-id={app}"}):
        container.remove(force=True)
    done = outcome(launcher, handle, within_s=30)
    assert done.result.status == TrialStatus.FAILED and done.infrastructure_failure
    assert "vanished" in (done.result.error or ""), done.result.error
    job = bench.job(sweep)
    assert launcher.reattach(handle.job_id, job) is None  # gone for a restarted sweep too


@pytest.mark.docker
@pytest.mark.slow
def test_a_finished_trials_containers_are_removed_once_its_logs_are_in(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    # issue 38: the containers of finished trials stayed until pruned
    import docker

    from tests.launchers.test_contract import OK_COMMAND

    bench = Bench("torchx-docker", tmp_path, request)
    sweep = bench.sweep(OK_COMMAND)
    launcher = bench.launcher(sweep)
    job = bench.job(sweep)
    handle = launcher.submit(job)
    done = outcome(launcher, handle)
    assert done.result.status == TrialStatus.OK, done.result.error
    assert done.log_path is not None and Path(done.log_path).stat().st_size > 0  # the logs were collected first
    app = handle.job_id.rsplit("/", 1)[-1]
    left = docker.from_env().containers.list(all=True, filters={"label": f"torchx.pytorch.org/app-id={app}"})
    assert left == []
    assert launcher.poll(handle) is not None  # an ended trial stays ended, its containers gone
