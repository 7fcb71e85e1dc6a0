"""Shared fixtures: sweeps built from small dicts, the path of the repository's spaces, and the
`sweep` command run as a user runs it (`sweep_cli`, `start_cli`)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep
from tests.in_process import run_here, runs_here

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "search_spaces"

# The suite's processes keep compiled bytecode, as Python does unless told not to. A machine that tells it
# not to (PYTHONDONTWRITEBYTECODE=1, as the image of this project's machines does) makes every Python the suite starts
# on a clean checkout (some 450 a run: `sweep` commands, trials, zygotes, SLURM's tasks) compile the modules
# of sweeper it imports anew (all 156 compile in 0.5 s of CPU), and each test worker rewrite every test
# module's asserts anew (its collection 20.7 s of CPU instead of 12.2). Set when pytest reads
# this file, before xdist starts its workers: they and everything they start inherit it. The files go to
# `__pycache__/`, which git ignores.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False


@pytest.fixture(autouse=True, scope="session")
def _no_user_profiles(tmp_path_factory: pytest.TempPathFactory) -> None:
    """An empty profile cache for the whole session (the `sweep` subprocesses inherit it): a profile
    the developer measured (`sweep profile`) must not change what the tests predict."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg_cache"))


@pytest.fixture(autouse=True, scope="session")
def _warm_zygote(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One fork server for the session's launches (`forking.WarmZygote`, named in the environment the
    `sweep` commands and the tests' own launches inherit): each sweep, profile and launch forks its ranks'
    zygote from it instead of starting one that imports torch, dynamo and the trainer (about 7 s of CPU,
    some 60 times a run). Only for a session that runs a slow test: a quick one would pay for the imports
    and fork nothing. A launch in another environment (the parity launches' kernels) starts its own, as
    in a sweep; `tiny_sweep` runs without it, so that a sweep's own server is tested too."""
    if not any(item.get_closest_marker("slow") for item in request.session.items):
        yield
        return
    # imports that set variables in the process (scikit-learn KMP_*, as each `sweep run`'s search imports it;
    # Ray RAY_CLIENT_MODE, as the torchx tests import it): made before the server copies the environment
    import ray  # noqa: F401
    import sklearn  # noqa: F401

    from sweeper.launchers.forking import WarmZygote
    from sweeper.process import SERVER_VAR

    os.environ["PYTHONPATH"] = cli_env()["PYTHONPATH"]  # as every `sweep` command's (`cli_env`)
    server = WarmZygote(tmp_path_factory.mktemp("zygote"))
    os.environ[SERVER_VAR] = server.environ()[SERVER_VAR]
    yield
    os.environ.pop(SERVER_VAR, None)
    server.close()


def in_ci() -> bool:
    """Whether this is a CI run (`CI` set and not false, as CI services and `.ci/run`'s callers set it)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def missing_reference(path: Path, why: str) -> NoReturn:
    """A file promised in ../shared/reference/ (beside the repository) is absent: in CI the test
    fails, for CI must run every reference case; elsewhere it skips, saying what is missing."""
    message = f"{path} is absent: {why}"
    if in_ci():
        pytest.fail(f"{message} (a CI run must not skip a reference case: restore ../shared/reference/)")
    pytest.skip(message)


def base_spec(**overrides: Any) -> dict[str, Any]:
    """A valid LLaMA-13B sweep on 8 nodes of 8 A100-80GB, with fields replaced by `overrides`."""
    spec: dict[str, Any] = {
        "name": "t",
        "model": "llama-13b",
        "seq_len": 2048,
        "global_batch_size": 2048,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "a100-80gb"},
        "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2]},
    }
    spec.update(overrides)
    return spec


def make_sweep(**overrides: Any) -> Sweep:
    return parse_sweep(yaml.safe_dump(base_spec(**overrides)))


@pytest.fixture
def sweep13b() -> Sweep:
    return make_sweep()


def cli_command(*args: str) -> list[str]:
    """`sweep ARGS` as an argument list: this interpreter, so the subprocess sees the same packages."""
    return [sys.executable, "-m", "sweeper.cli", *args]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of a `sweep` subprocess: this one's plus `extra`, with this checkout first on
    the import path (run from a temporary folder, `python -m` would import an installed copy)."""
    path = os.environ.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != str(ROOT):
        path = os.pathsep.join(p for p in (str(ROOT), path) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def sweep_cli(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    timeout: float = 600,
    merge_stderr: bool = False,
    process: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`sweep ARGS` run to its end in `cwd`, as a script sees it: stdout and stderr piped (not a
    terminal; one pipe with `merge_stderr`), stdin `input` or empty, `env` (default `cli_env()`).
    A command that only reads and prints runs in this process (`tests/in_process.py`: a new Python
    for each cost a third of the suite's CPU); `process=True` runs it as a process all the same."""
    if not process and runs_here(args):
        return run_here(args, cwd=cwd, env=cli_env() if env is None else env, input=input, merge_stderr=merge_stderr)
    return subprocess.run(
        cli_command(*args),
        cwd=cwd,
        env=cli_env() if env is None else dict(env),
        text=True,
        input=input,
        stdin=subprocess.DEVNULL if input is None else None,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        timeout=timeout,
        check=False,
    )


def start_cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """`sweep ARGS` started in `cwd` and left running (to kill, to run beside); output piped as `sweep_cli`."""
    return subprocess.Popen(
        cli_command(*args),
        cwd=cwd,
        env=cli_env() if env is None else dict(env),
        text=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


@dataclasses.dataclass(frozen=True)
class RealSweep:
    """A sweep run for real by `sweep run`: its sweep file, its results folder and what the run printed."""

    spec: Path
    results: Path
    run: subprocess.CompletedProcess[str]


@pytest.fixture(scope="session")
def tiny_cpu_sweep(tmp_path_factory: pytest.TempPathFactory) -> RealSweep:
    """The shipped tiny CPU sweep run for real once per session (4 trials of 4 steps, 2 processes each) for
    the tests that read its results (cli/test_run, report/test_page); a trial costs seconds of CPU."""
    root = tmp_path_factory.mktemp("tiny_cpu")
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec["results_dir"] = str(root / "results")
    spec["trial"].update(steps=4, warmup_steps=1)
    spec["search"] = {"max_trials": 4, "parallel": 1, "seed": 0}
    path = root / "tiny_cpu.yaml"
    path.write_text(yaml.safe_dump(spec))
    # without the session's fork server (`_warm_zygote`): this sweep keeps one of its own, as a user's does
    env = {k: v for k, v in cli_env().items() if k != "SWEEP_ZYGOTE_SERVER"}
    return RealSweep(path, root / "results" / spec["name"], sweep_cli("run", str(path), cwd=root, env=env))


# the session fixtures of the real engines: `slurm_cluster` (a real single-node SLURM, root only),
# `ray_head` (a Ray head on free ports), `docker_daemon` (a private dockerd, root only)
pytest_plugins = ["tests.slurm_cluster", "tests.ray_cluster", "tests.docker_daemon"]

# Each engine's tests run in one group, one after another in one worker: the worker's session
# starts the engine once (two workers would start two SLURM clusters or two dockerd on one base,
# and each one's stop would end the other's). A test is in it by its marker, or by the fixture.
_ENGINES = {"slurm": "slurm_cluster", "ray": "ray_head", "docker": "docker_daemon", "netns": "netns_nodes"}
# engines whose tests share one thing on the machine and so one group: the SLURM tests on the namespaces
# remake the session's cluster inside them, and the namespaces' own tests make and remove those same
# namespaces (`sweep-node<k>`), so neither may run beside the other
_SAME_GROUP = {"netns": "slurm"}

# Fixtures made once per session or module that are cheap or hold nothing shared between workers
# (the engines' fixtures are handled by their groups, above).
# `_no_user_profiles` and `_warm_zygote` are autouse (each worker makes its own): every test uses them,
# and counted as shared either would put every test outside the engines' groups in one unit of work, run
# by one worker in the order of collection (the whole suite in one process, as it was for a while; and,
# through `_warm_zygote`, 1527 of 1647 tests in one worker, while the other ran the engines' 120 and then
# waited 228 s). tests/harness/test_scheduling.py checks that a plain test is in no group.
_NOT_SHARED = frozenset(
    {
        *_ENGINES.values(),
        "_no_user_profiles",
        "_warm_zygote",
        "private_tmpdir",
        "tmp_path_factory",
        "worker_id",
        "testrun_uid",
    }
)
_GROUPS_DIR = pytest.StashKey[Path]()
_CACHE_DIR = pytest.StashKey[Path]()
_INDUCTOR_DIR = pytest.StashKey[Path]()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own `XDG_CACHE_HOME` (its `sweep` subprocesses inherit it): no learned profile of another test."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def pytest_configure(config: pytest.Config) -> None:
    """The folders the run's processes share, removed at its end (`pytest_unconfigure`): the controller of
    `pytest -n 2 --dist loadgroup` makes one where each worker writes the group of each test it collected
    (read by `pytest_xdist_make_scheduler`), and the run's inductor cache."""
    # learned profiles (`sweeper.search.learned`) live in the user's cache: never the real one, and never
    # one shared by two tests (a sweep's profile would steer the next test's sweep): a folder for the
    # session here, in place before any session fixture runs a sweep, and one per test (`_own_cache`)
    import tempfile

    config.stash[_CACHE_DIR] = Path(tempfile.mkdtemp(prefix="sweep-test-cache-"))
    os.environ["XDG_CACHE_HOME"] = str(config.stash[_CACHE_DIR])
    if hasattr(config, "workerinput"):
        return
    if config.getoption("store_durations"):
        config.pluginmanager.register(_DurationRecorder(), "sweep-durations")
    # one inductor cache for the whole run, which the workers and all they start inherit: a kernel or
    # the precompiled header (13 s of cc1plus) one worker compiled, the other loads (inductor locks
    # each entry while it compiles it) instead of compiling it again under its own TMPDIR
    config.stash[_INDUCTOR_DIR] = Path(tempfile.mkdtemp(prefix="sweep-test-inductor-"))
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(config.stash[_INDUCTOR_DIR])
    if config.getoption("dist", "no") == "loadgroup":
        config.stash[_GROUPS_DIR] = Path(tempfile.mkdtemp(prefix="sweep-xdist-groups-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    for folder in (_CACHE_DIR, _GROUPS_DIR, _INDUCTOR_DIR):
        if folder in config.stash:
            shutil.rmtree(config.stash[folder], ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each xdist worker where to write its tests' groups (under `--dist loadgroup` only: `-n 2`
    alone schedules tests one by one and has no groups to read)."""
    if _GROUPS_DIR in node.config.stash:
        node.workerinput["sweep_groups_dir"] = str(node.config.stash[_GROUPS_DIR])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` with the groups of `pytest_collection_modifyitems`: one unit of work per
    group, every other test a unit of its own. (pytest-xdist 3.8 cannot read its own `xdist_group`
    marks under pytest 9: it renames `item._nodeid`, which pytest 9 no longer reads.)"""
    if _GROUPS_DIR not in config.stash:
        return None
    from xdist.scheduler import LoadScopeScheduling

    folder = config.stash[_GROUPS_DIR]

    class SharedLaunchScheduling(LoadScopeScheduling):  # type: ignore[misc]
        groups: dict[str, str] | None = None
        slow: set[str] = set()
        known = _recorded_durations()

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # called once every worker has collected, so every file is there
                self.groups = {}
                for path in sorted(folder.glob("*.json")):
                    collected = json.loads(path.read_text())
                    self.groups.update(collected["groups"])
                    self.slow = self.slow | set(collected["slow"])
            return self.groups.get(nodeid, nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            """The unit of most work first (the longest-first rule: what is left at the end is short,
            so neither worker waits long for the other), not xdist's order (most tests first, then
            the order of collection, which left a `slow` test of a minute or more to start last)."""
            heaviest = max(self.workqueue, key=lambda scope: _weight(self.workqueue[scope], self.slow, self.known))
            self.workqueue.move_to_end(heaviest, last=False)
            super()._assign_work_unit(node)

    return SharedLaunchScheduling(config, log)


# The seconds each test of a second or more took in a run of the README's command (setup, call and
# teardown, on a worker sharing the machine with the other), written by `--store-durations`. Why: guessed
# from the marks alone (20 s a `slow` test, 0.5 s any other), the longest-first rule left the parsers'
# group (90 s, no test marked slow) to start last, and one worker ran 214 s alone at the end of a 23-minute
# run. A test not listed (new, or under a second) is guessed from its mark, so the file may lag the suite.
DURATIONS = Path(__file__).with_name("durations.json")
_STORED = 1.0  # the least seconds a test must take to be listed: the 1400 quicker tests take 90 s in all


def _weight(unit: Mapping[str, bool], slow: set[str], known: Mapping[str, float]) -> float:
    """The seconds a unit of work takes: its tests' recorded seconds (`DURATIONS`), or a guess from the
    mark of a test not recorded: one marked `slow` (a multi-process run, a real sweep) takes tens of
    seconds, any other a tenth of one."""
    return sum(known.get(nodeid, 20.0 if nodeid in slow else 0.1) for nodeid in unit)


def _recorded_durations() -> dict[str, float]:
    try:
        return {str(k): float(v) for k, v in json.loads(DURATIONS.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # no file, or not one this wrote: every unit guessed from its marks


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-durations",
        action="store_true",
        help=f"record the seconds of each test run (those of {_STORED:g} s or more) in {DURATIONS.name}, for the scheduler",
    )


class _DurationRecorder:
    """The controller's view of every test's report (each worker's, under xdist): their seconds summed
    by test, merged into `DURATIONS` when the session ends."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # registered in the controller only (pytest_configure); the tests this run ran replace what was
        # recorded of them, the others' records stay
        kept = {k: v for k, v in _recorded_durations().items() if k not in self.seconds}
        kept |= {k: round(v, 1) for k, v in self.seconds.items() if v >= _STORED}
        DURATIONS.write_text(json.dumps(dict(sorted(kept.items())), indent=0) + "\n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In each worker of `pytest -n 2 --dist loadgroup` (CI, the README's command): the tests that
    share a launch made once per session or module (the parity launches, the tiny CPU sweep, the
    parsers' harnesses), directly or through another such fixture, form one group, run by one worker,
    so that each launch still runs once; every SLURM test is in one group (`@slurm`), run one after
    another, as the one local cluster needs, and so are the Ray tests (`@ray`), the Docker tests
    (`@docker`); the tests of the namespaces' two-node cluster run in the SLURM group (`_SAME_GROUP`).
    Without xdist nothing is grouped."""
    folder = getattr(config, "workerinput", {}).get("sweep_groups_dir")
    if folder is None:
        return
    group_of: dict[str, str] = {}  # a shared fixture -> its group's name (union-find, by the least name)

    def find(name: str) -> str:
        while group_of.setdefault(name, name) != name:
            name = group_of[name]
        return name

    item_fixtures = {item.nodeid: _shared_fixtures(item) for item in items}
    for names in item_fixtures.values():
        roots = sorted({find(n) for n in names})
        for root in roots[1:]:
            group_of[root] = roots[0]
    groups = {}
    for item in items:
        names = item_fixtures[item.nodeid]
        engine = next(
            (m for m, f in _ENGINES.items() if item.get_closest_marker(m) is not None or f in item.fixturenames), None
        )
        if engine is not None:
            groups[item.nodeid] = "@" + _SAME_GROUP.get(engine, engine)
        elif names:
            groups[item.nodeid] = "@" + find(names[0])
    slow = [item.nodeid for item in items if item.get_closest_marker("slow") is not None]
    Path(folder, f"{config.workerinput['workerid']}.json").write_text(json.dumps({"groups": groups, "slow": slow}))


def _shared_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures made once per session or module that `item` uses, directly or not. Where one of
    them is parametrized (the parity launches, once per kernel setting), each name carries the item's
    parameters of those fixtures: the launch of each setting is a group of its own."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    shared = sorted(
        name
        for name, defs in info.name2fixturedefs.items()
        if name not in _NOT_SHARED and any(d.scope in ("session", "package", "module") for d in defs)
    )
    params = getattr(getattr(item, "callspec", None), "params", {})
    instance = ",".join(str(params[name]) for name in shared if name in params)
    return [f"{name}[{instance}]" if instance else name for name in shared]
