"""A clearly slow trial is stopped early (Optuna's pruner over per-step MFU), recorded as stopped_early
with the GPU time it saved; a running trial's step times are read from the trainer's steps file."""

from __future__ import annotations

import optuna
import pandas as pd
import pytest
import yaml

from sweeper.launchers.replay import ReplayLauncher
from sweeper.run.orchestrator import prepare, run_loop
from sweeper.run.slow_trials import read_steps_file
from sweeper.spec.loader import load_sweep
from tests.conftest import base_spec


def test_a_slow_trial_is_stopped_early_and_its_saved_gpu_time_recorded(tmp_path):
    table = tmp_path / "table.parquet"
    # 20 s a step: this 64-GPU model's MFU stays a possible one (at 1 s it was 17, failed as impossible)
    slow = [20.0] + [60.0] * 9  # 3x the first layout's pace after the warm-up step
    pd.DataFrame(
        [
            {"tp": 4, "status": "ok", "step_time_mean_s": 20.0, "step_times_s": [20.0] * 10},
            {"tp": 8, "status": "ok", "step_time_mean_s": 60.0, "step_times_s": slow},
        ]
    ).to_parquet(table)
    spec = base_spec(
        name="slow",
        results_dir=str(tmp_path / "results"),
        space={"tp": [4, 8]},
        search={"sampler": "grid", "max_trials": 2},
        trial={"steps": 10, "warmup_steps": 1},
    )
    path = tmp_path / "slow.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    run = prepare(sweep, ReplayLauncher(table, sweep))
    assert list(run.plan.status) == ["candidate", "candidate"]
    run_loop(run, poll_s=0)

    rows = pd.read_parquet(tmp_path / "results" / "slow" / "trials").sort_values("trial_number")
    assert rows.status.tolist() == ["ok", "stopped_early"]
    stopped = rows.iloc[1]
    # stopped after the warm-up step and the three measured steps the noise-aware pruner needs: 6 of 10 not run
    assert list(stopped.step_times_s) == [20.0, 60.0, 60.0, 60.0]
    assert stopped.gpu_hours_saved == pytest.approx(64 * 6 * 60.0 / 3600)
    assert pd.isna(rows.iloc[0].gpu_hours_saved)
    assert "stopped early after 4 of 10 steps" in stopped.error
    study = optuna.load_study(study_name="slow", storage=f"sqlite:///{tmp_path}/results/slow/optuna.db")
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"]
    assert list(study.trials[1].intermediate_values) == [0, 1, 2]


def test_a_trial_as_fast_as_the_best_runs_to_its_end(tmp_path):
    table = tmp_path / "table.parquet"
    pd.DataFrame(
        [
            {"tp": 4, "status": "ok", "step_time_mean_s": 20.0, "step_times_s": [20.0] * 10},
            {"tp": 8, "status": "ok", "step_time_mean_s": 28.0, "step_times_s": [20.0] + [28.0] * 9},  # 1.4x, not 1.5x
        ]
    ).to_parquet(table)
    spec = base_spec(
        name="even",
        results_dir=str(tmp_path / "results"),
        space={"tp": [4, 8]},
        search={"sampler": "grid", "max_trials": 2},
        trial={"steps": 10, "warmup_steps": 1},
    )
    path = tmp_path / "even.yaml"
    path.write_text(yaml.safe_dump(spec))
    sweep = load_sweep(path)
    run = prepare(sweep, ReplayLauncher(table, sweep))
    run_loop(run, poll_s=0)
    assert sorted(r["status"] for r in run.rows) == ["ok", "ok"]


def test_steps_file_is_read_to_its_last_whole_line(tmp_path):
    f = tmp_path / "steps.txt"
    f.write_text("0.5\n0.25\n0.2")  # the last step is being written
    assert read_steps_file(f) == [0.5, 0.25]
    assert read_steps_file(tmp_path / "missing.txt") == []
