"""The contract every launcher keeps, one suite run against each (as Optuna runs one suite over every storage).

Submit and poll to an outcome, cancel, re-attach after a restart, a failing trial, a trial past
its time limit. Parametrised over the launcher registry: a new launcher fails `test_every_launcher_has_a_harness`
until it has a harness below, and then runs every case. Real components throughout: local
processes, the session's real SLURM (`slurm_cluster`, marked `slurm`), a replay table on disk.
The trials run the Megatron stand-in (tests/standins) or a plain command as an external
workload, so no case waits for torch to start: the local cases take a few seconds in all.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.launchers import Handle, JobOutcome, Launcher, TrialJob, launcher_classes, make_launcher
from sweeper.layouts.layout import Layout
from sweeper.spec.loader import load_sweep
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus
from tests.conftest import SPACES

STANDIN = Path(__file__).parents[1] / "standins" / "megatron_pretrain.py"
LAYOUT = Layout(tp=1, pp=1, micro_batch_size=1)
OK_COMMAND = f"{sys.executable} {STANDIN} {{flags}}"
LONG_COMMAND = "sleep 600"
FAILING_COMMAND = 'sh -c "echo the trainer gave up >&2; exit 3"'
LIMIT_MIN = 0.05  # a 3 s trial limit: the trial's own limit, which every launcher must report as a timeout


@dataclass(frozen=True)
class Harness:
    """How the suite drives one launcher on one engine: its profile, and how to tell a trial still runs."""

    kind: str  # the launcher's kind in the registry
    profile: Callable[[Bench], dict[str, Any] | str]  # the sweep file's `launcher:` (a mapping or a profile's name)
    alive: Callable[[Handle], bool]  # the trial's process, job or container still runs
    not_applicable: dict[str, str]  # case -> why the operation means nothing for this launcher


def _local_alive(handle: Handle) -> bool:
    try:
        stat = Path(f"/proc/{handle.info['pid']}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie of ours has ended


def _slurm_alive(handle: Handle) -> bool:
    out = subprocess.run(
        ["squeue", "-h", "-j", handle.job_id, "-t", "PENDING,RUNNING", "-o", "%T"], capture_output=True, text=True
    ).stdout
    return bool(out.strip())


def _replay_profile(bench: Bench) -> dict[str, Any]:
    # the table knows LAYOUT only: any other layout is the replay launcher's failing trial
    table = bench.tmp_path / "table.csv"
    table.write_text("tp,pp,micro_batch_size,status,step_time_mean_s\n1,1,1,ok,0.5\n")
    return {"kind": "replay", "table": str(table)}


def app_pids(job_id: str, command: bytes = b"") -> list[int]:
    """The live processes of a torchx app on this host whose command line holds `command`: its replicas
    and what they started (the runner sets TORCHX_JOB_ID, ending in the app's id, in every replica's
    environment, and children inherit it)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            variables = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if state == "Z" or command not in cmdline:
            continue
        apps = [v.decode(errors="replace").rsplit("/", 1)[-1] for v in variables if v.startswith(b"TORCHX_JOB_ID=")]
        if any(app and job_id.endswith(app) for app in apps):
            found.append(int(proc.name))
    return found


def _app_processes_alive(handle: Handle) -> bool:
    return bool(app_pids(handle.job_id))


def _container_alive(handle: Handle) -> bool:
    import docker

    app = handle.job_id.rsplit("/", 1)[-1]
    return bool(docker.from_env().containers.list(filters={"label": f"torchx.pytorch.org/app-id={app}"}))


def _ray_profile(bench: Bench) -> dict[str, Any]:
    head = bench.request.getfixturevalue("ray_head")
    # python: the test's own (the head's workers inherit no virtual environment's PATH here)
    return {
        "kind": "torchx",
        "scheduler": "ray",
        "python": sys.executable,
        "cfg": {"dashboard_address": head.dashboard},
    }


def _docker_profile(bench: Bench) -> str:
    # mounts are a site's to give: a profile under launchers/ of the folder the sweep runs from
    daemon = bench.request.getfixturevalue("docker_daemon")
    folder = bench.tmp_path / "launchers"
    folder.mkdir(exist_ok=True)
    profile = {
        "kind": "torchx",
        "scheduler": "local_docker",
        "image": daemon.image,
        "python": sys.executable,
        "mounts": list(daemon.mounts),
    }
    (folder / "docker_test.yaml").write_text(yaml.safe_dump(profile))
    bench.request.getfixturevalue("monkeypatch").chdir(bench.tmp_path)
    return "docker_test"


HARNESSES: dict[str, Harness] = {
    "local": Harness("local", lambda _: {"kind": "local"}, _local_alive, {}),
    "slurm": Harness("slurm", lambda _: {"kind": "slurm", "poll_s": 0.5, "exclusive": False}, _slurm_alive, {}),
    "replay": Harness(
        "replay",
        _replay_profile,
        lambda _: False,
        {
            "cancel": "replay runs nothing: its answer is there the moment it is asked for",
            "timeout": "replay runs nothing, so nothing can outlive a limit (a recorded timeout is replayed as data)",
            "reattach_gone": "replay has no process or job that could be gone: its answers are repeatable",
        },
    ),
    "torchx-ray": Harness("torchx", _ray_profile, _app_processes_alive, {}),
    "torchx-docker": Harness("torchx", _docker_profile, _container_alive, {}),
    "torchx-local_cwd": Harness(
        "torchx",
        lambda _: {"kind": "torchx", "scheduler": "local_cwd", "poll_s": 0.5},
        _app_processes_alive,
        {"reattach": "torchx's local_cwd scheduler keeps its apps in the process that submitted them"},
    ),
}
MARKS = {
    "slurm": [pytest.mark.slurm, pytest.mark.slow],
    "torchx-ray": [pytest.mark.ray, pytest.mark.slow],
    "torchx-docker": [pytest.mark.docker, pytest.mark.slow],
}
ENGINES = [pytest.param(name, marks=MARKS.get(name, [])) for name in HARNESSES]


@dataclass
class Bench:
    """One launcher of the kind under test, for a sweep whose trials run `command`."""

    engine: str  # a key of HARNESSES
    tmp_path: Path
    request: pytest.FixtureRequest

    @property
    def kind(self) -> str:
        return HARNESSES[self.engine].kind

    def sweep(self, command: str, *, timeout_min: float = 5) -> Sweep:
        spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
        spec.update(name=f"contract-{self.kind}", results_dir=str(self.tmp_path / "results"))
        spec["launcher"] = HARNESSES[self.engine].profile(self)
        spec["workload"] = {"kind": "megatron" if "{flags}" in command else "command", "command": command}
        spec["trial"].update(steps=4, timeout_min=timeout_min)
        path = self.tmp_path / f"sweep-{len(list(self.tmp_path.glob('sweep-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(spec))
        return load_sweep(path)

    def launcher(self, sweep: Sweep) -> Launcher:
        if self.kind == "slurm":
            self.request.getfixturevalue("slurm_cluster")  # the session's SLURM is up
        launcher = make_launcher(sweep)
        assert launcher.kind == self.kind
        return launcher

    def job(self, sweep: Sweep, *, number: int = 0, layout: Layout = LAYOUT) -> TrialJob:
        assert sweep.source is not None
        return TrialJob(
            number=number,
            layout=layout,
            spec_path=Path(sweep.source),
            workdir=self.tmp_path / "jobs" / f"trial-{number:05d}-a1",
            timeout_s=sweep.trial.timeout_min * 60,
        )

    def skip_unless(self, case: str) -> None:
        reason = HARNESSES[self.engine].not_applicable.get(case)
        if reason:
            pytest.skip(f"{self.engine}: {reason}")


@pytest.fixture(params=ENGINES)
def bench(request: pytest.FixtureRequest, tmp_path: Path) -> Bench:
    return Bench(request.param, tmp_path, request)


def outcome(launcher: Launcher, handle: Handle, *, within_s: float = 120) -> JobOutcome:
    """Poll as the sweep loop does until the trial has ended."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done = launcher.poll(handle)
        if done is not None:
            return done
        time.sleep(0.2)
    raise AssertionError(f"{launcher.kind} job {handle.job_id}: no outcome after {within_s} s")


def test_every_launcher_has_a_harness() -> None:
    assert set(launcher_classes()) == {h.kind for h in HARNESSES.values()}, (
        "a new launcher needs a Harness in this file"
    )


def test_submit_then_poll_gives_the_trials_result(bench: Bench) -> None:
    sweep = bench.sweep(OK_COMMAND)
    launcher = bench.launcher(sweep)
    job = bench.job(sweep)
    handle = launcher.submit(job)
    assert handle.job_id and handle.job == job  # known at once: the sweep records it before waiting
    done = outcome(launcher, handle)
    assert done.job_id == handle.job_id and not done.infrastructure_failure
    assert done.result.status == TrialStatus.OK, done.result.error
    assert (done.result.tp, done.result.pp, done.result.micro_batch_size) == (1, 1, 1)
    assert done.result.step_time_mean_s is not None and done.result.step_time_mean_s > 0
    assert launcher.poll(handle) is not None  # an ended trial stays ended


def test_a_failing_trial_is_a_failed_outcome(bench: Bench) -> None:
    sweep = bench.sweep(FAILING_COMMAND)
    launcher = bench.launcher(sweep)
    # replay's failing trial is a layout its table does not have
    job = bench.job(sweep, layout=Layout(tp=2, pp=1, micro_batch_size=1) if bench.kind == "replay" else LAYOUT)
    done = outcome(launcher, launcher.submit(job))
    assert done.result.status == TrialStatus.FAILED and done.result.error
    assert done.result.tp == job.layout.tp  # the row says which layout failed
    if bench.kind != "replay":
        assert "exit" in done.result.error and "3" in done.result.error, done.result.error


def test_a_trial_past_its_limit_is_a_timeout(bench: Bench) -> None:
    bench.skip_unless("timeout")
    sweep = bench.sweep(LONG_COMMAND, timeout_min=LIMIT_MIN)
    launcher = bench.launcher(sweep)
    start = time.monotonic()
    done = outcome(launcher, launcher.submit(bench.job(sweep)), within_s=60)
    assert done.result.status == TrialStatus.TIMEOUT, done.result.error
    assert LIMIT_MIN * 60 <= time.monotonic() - start < 60  # ended by the limit, not by `sleep 600`


def test_cancel_ends_the_trial_and_everything_it_started(bench: Bench) -> None:
    bench.skip_unless("cancel")
    sweep = bench.sweep(LONG_COMMAND)
    launcher = bench.launcher(sweep)
    harness = HARNESSES[bench.engine]
    handle = launcher.submit(bench.job(sweep))
    deadline = time.monotonic() + 30  # a scheduler may first wait for resources (Ray's placement group)
    while not harness.alive(handle) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert harness.alive(handle)
    assert launcher.poll(handle) is None  # still running: `sleep 600`
    launcher.cancel(handle)
    done = outcome(launcher, handle, within_s=30)
    assert done.result.status == TrialStatus.FAILED, done.result.error
    deadline = time.monotonic() + 30
    while harness.alive(handle) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not harness.alive(handle)
    if bench.kind == "local":  # the trial's whole process group, `sleep` included
        assert not [p for p in Path("/proc").glob("[0-9]*") if _in_group(p, handle.info["pid"])]


def _in_group(proc: Path, pgid: int) -> bool:
    try:
        fields = proc.joinpath("stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return int(fields[2]) == pgid and fields[0] != "Z"


def test_reattach_after_a_restart_collects_the_same_trial(bench: Bench) -> None:
    # slurm: the tiny cluster has 2 devices per node and an external trainer runs 1 task per
    # node; re-attach must wait for the tasks the job has, not one per device
    bench.skip_unless("reattach")
    sweep = bench.sweep(OK_COMMAND)
    job = bench.job(sweep)
    handle = bench.launcher(sweep).submit(job)
    again = bench.launcher(sweep)  # a new `sweep run`: nothing of the first launcher is left
    found = again.reattach(handle.job_id, job)
    assert found is not None and found.job_id == handle.job_id
    done = outcome(again, found)
    assert done.job_id == handle.job_id
    assert done.result.status == TrialStatus.OK, done.result.error


def test_reattach_to_a_trial_that_is_gone_finds_nothing(bench: Bench) -> None:
    bench.skip_unless("reattach_gone")
    sweep = bench.sweep(FAILING_COMMAND)
    launcher = bench.launcher(sweep)
    job = bench.job(sweep)
    done = outcome(launcher, launcher.submit(job))
    gone = TrialJob(job.number, job.layout, job.spec_path, bench.tmp_path / "jobs" / "elsewhere", job.timeout_s)
    assert bench.launcher(sweep).reattach(done.job_id, gone) is None


def test_profiles_are_validated_by_their_own_launchers_model(tmp_path: Path) -> None:
    # each kind's profile model is the one registered for it; an unknown kind names the kinds
    from sweeper.errors import SpecError
    from sweeper.launchers import resolve_profile

    for kind, cls in launcher_classes().items():
        assert cls.kind == kind and cls.profile_model is not None
    bench = Bench("local", tmp_path, None)  # type: ignore[arg-type]
    sweep = bench.sweep(OK_COMMAND)
    with pytest.raises(SpecError, match="'k8s' is not a launcher; kinds: local, replay, slurm, torchx"):
        resolve_profile(replace(sweep, launcher={"kind": "k8s"}))
    with pytest.raises(SpecError, match=r"launcher: bogus: unknown field; allowed: kind, partition, account"):
        resolve_profile(replace(sweep, launcher={"kind": "slurm", "bogus": 1}))
