"""The estimate's start-up from what is known: the median start-up this sweep's finished trials
measured on its launcher, else the launcher kind's default (local processes start in seconds, a
cluster job in minutes), and none, with no steps, for a replay; the dry run names the source."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sweeper.launchers.startup import trial_startup
from sweeper.plan.plan import make_plan
from sweeper.plan.summary import cost_estimate
from sweeper.results.rows import ResultsStore
from sweeper.spec.loader import parse_sweep
from tests.conftest import SPACES, sweep_cli


def _tiny(tmp_path: Path, **changes) -> dict:
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec.update(results_dir=str(tmp_path / "results"), **changes)
    return spec


def test_each_launcher_kind_has_its_default_and_a_replay_none(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("tp,pp,micro_batch_size,status,mfu,step_time_mean_s\n1,1,1,ok,0.5,1.0\n")
    local = trial_startup(parse_sweep(yaml.safe_dump(_tiny(tmp_path, launcher="local"))))
    slurm = trial_startup(parse_sweep(yaml.safe_dump(_tiny(tmp_path, launcher={"kind": "slurm"}))))
    replay = trial_startup(
        parse_sweep(yaml.safe_dump(_tiny(tmp_path, launcher={"kind": "replay", "table": str(table)})))
    )
    assert (local.seconds, slurm.seconds, replay.seconds) == (10.0, 120.0, 0.0)
    assert "local processes" in local.source and replay.runs_steps is False


def test_finished_trials_measured_start_up_wins(tmp_path):
    sweep = parse_sweep(yaml.safe_dump(_tiny(tmp_path, name="measured", launcher="local")))
    store = ResultsStore(sweep.results_path)
    store.ensure()
    for n, s in enumerate([6.0, 8.0, 30.0]):
        store.write_row({"trial_number": n, "status": "ok", "launcher": "local", "startup_s": s, "tp": 1, "pp": 1})
    store.write_row({"trial_number": 3, "status": "failed", "launcher": "local", "startup_s": 500.0})
    got = trial_startup(sweep)
    assert got.seconds == 8.0 and "median of this sweep's 3 finished trial(s) on local" in got.source
    plan = make_plan(sweep)
    est = cost_estimate(plan, got)
    assert cost_estimate(plan).trial_s - est.trial_s == pytest.approx(120.0 - 8.0)  # the assumed 2 min
    assert "each trial 8 s of start-up (the median of this sweep's 3" in est.assumes


def test_a_replay_dry_run_assumes_no_start_up_and_no_steps(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("tp,pp,micro_batch_size,status,mfu,step_time_mean_s\n1,1,1,ok,0.5,1.0\n")
    path = tmp_path / "rep.yaml"
    path.write_text(yaml.safe_dump(_tiny(tmp_path, name="rep", launcher={"kind": "replay", "table": str(table)})))
    r = sweep_cli("run", str(path), "--dry-run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "0 s of start-up (a replay answers from its table) and no steps" in r.stdout
    assert "2 min of start-up" not in r.stdout
