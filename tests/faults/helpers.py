"""Shared by the fault-injection tests: a small real sweep, the CLI as a subprocess, and checks
of the final state (rows, Optuna trial states, processes left behind)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import yaml

from tests.conftest import SPACES, cli_command, cli_env, start_cli, sweep_cli

LAYOUT_KNOBS = ["tp", "pp", "micro_batch_size", "activation_checkpointing"]

# the CLI runner of every test (tests/conftest.py), under the names the fault tests use
cli, env_with, sweep, start = cli_command, cli_env, sweep_cli, start_cli


def spec_file(
    tmp_path: Path,
    name: str,
    *,
    trial: dict | None = None,
    search: dict | None = None,
    space: dict | None = None,
    launcher: Any = "local",
) -> Path:
    """The shipped tiny CPU sweep (2 processes), renamed, with its results under tmp_path."""
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(name=name, results_dir=str(tmp_path / "results"), launcher=launcher)
    spec["trial"].update({"steps": 3, "warmup_steps": 1} | (trial or {}))
    spec["search"] = {"max_trials": 2, "parallel": 1, "seed": 0} | (search or {})
    if space is not None:
        spec["space"] = space
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def results(tmp_path: Path, name: str) -> Path:
    return tmp_path / "results" / name


def frame(tmp_path: Path, name: str) -> pd.DataFrame:
    return pd.read_parquet(results(tmp_path, name) / "trials")


def optuna_states(tmp_path: Path, name: str) -> dict[int, str]:
    """Optuna trial number -> state name, read from results/<name>/optuna.db."""
    storage = f"sqlite:///{results(tmp_path, name) / 'optuna.db'}"
    study = optuna.load_study(study_name=name, storage=storage)
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def assert_rows_match_study(tmp_path: Path, name: str) -> pd.DataFrame:
    """Every row's Optuna trial is finished (COMPLETE when ok, FAIL when it failed), and none is left RUNNING."""
    df = frame(tmp_path, name)
    states = optuna_states(tmp_path, name)
    assert "RUNNING" not in states.values(), states
    for n, status in zip(df.optuna_trial, df.status):
        assert states[int(n)] == ("COMPLETE" if status == "ok" else "FAIL"), (int(n), status, states)
    assert not df.trial_number.duplicated().any()
    assert not list((results(tmp_path, name) / "inflight").glob("trial-*.json"))
    return df


def wait_for(predicate, *, timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def processes_with(marker: str) -> list[int]:
    """Live (not zombie) processes whose command line, environment or standard output and error mention
    `marker`: a zygote forked by the sweep's warm server, and its ranks, have the server's command line and
    environment, but write to their trial's logs."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if (d / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                continue
            blob = (d / "cmdline").read_bytes() + b"\0" + (d / "environ").read_bytes() + b"\0" + _outputs(d)
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(d.name))
    return found


def _outputs(proc: Path) -> bytes:
    """Where a process's stdout and stderr go (b"" for those it has not)."""
    out = []
    for fd in (1, 2):
        try:
            out.append(os.readlink(proc / "fd" / str(fd)).encode())
        except OSError:
            pass
    return b"\0".join(out)


def rank_pids(trial_dir: Path) -> list[int]:
    """The rank processes of a local trial, by rank: every process writing to a rank's log of its launch
    (`ranks/logs/rankR.log`), forked by a zygote or each started as `python -m sweeper.runtime.worker DIR`."""
    logs = trial_dir / "ranks" / "logs"
    by_rank = {}
    for pid in processes_with(str(logs)):
        try:
            out = Path(os.readlink(f"/proc/{pid}/fd/1"))
        except OSError:
            continue
        if out.parent == logs and out.name.startswith("rank"):
            by_rank[int(out.stem.removeprefix("rank"))] = pid
    return [by_rank[r] for r in sorted(by_rank)]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def assert_no_processes_left(root: Path, *, timeout: float = 20) -> None:
    """Nothing started for this sweep (trial processes, ranks) outlives it."""
    deadline = time.time() + timeout
    while (left := processes_with(str(root))) and time.time() < deadline:
        time.sleep(0.2)
    assert not left, f"processes left behind: {[Path(f'/proc/{p}/cmdline').read_bytes() for p in left if alive(p)]}"


def kill(pid: int, sig: int = signal.SIGKILL) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# `sweep ARGS` in a subprocess whose function TARGET ("module:Class.method") does ACTION at its
# CALL-th call (1-based): SIGKILL itself before the call or after it returns, fill the disk of
# FILL (a file written until the file system refuses a byte) and then make the call, or run the
# Python CODE and then make the call
_PLACED = """
import os, signal, sys
from importlib import import_module
from sweeper.cli import main

target, call, action, fill, code = {target!r}, {call}, {action!r}, {fill!r}, {code!r}
module, _, attr = target.partition(":")
owner_name, _, name = attr.rpartition(".")
owner = import_module(module)
for part in filter(None, owner_name.split(".")):
    owner = getattr(owner, part)
original, seen = getattr(owner, name), [0]

def fill_disk(path):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 1):
            try:
                while os.write(fd, b"\\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)

def placed(*args, **kwargs):
    seen[0] += 1
    if seen[0] == call and action == "kill-before":
        os.kill(os.getpid(), signal.SIGKILL)
    if seen[0] == call and action == "fill-disk":
        fill_disk(fill)
    if seen[0] == call and action == "exec-before":
        exec(code)
    out = original(*args, **kwargs)
    if seen[0] == call and action == "kill-after":
        os.kill(os.getpid(), signal.SIGKILL)
    return out

setattr(owner, name, placed)
sys.argv = ["sweep", *{args!r}]
main()
"""


def sweep_placed(
    target: str, *args: str, call: int, action: str, cwd: Path, fill: Path | None = None, code: str = ""
) -> subprocess.CompletedProcess[str]:
    """`sweep ARGS` with a fault placed at one exact moment (see _PLACED): a SIGKILL before or after
    the CALL-th call of TARGET, the disk of `fill` filled just before it, or `code` run just before
    it; run to its end."""
    assert action in ("kill-before", "kill-after", "fill-disk", "exec-before")
    script = _PLACED.format(
        target=target, call=call, action=action, fill=str(fill) if fill else "", code=code, args=list(args)
    )
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=cli_env(),
        text=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=600,
    )
