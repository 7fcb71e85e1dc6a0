"""A sweep's budget in GPU-hours (`search.max_gpu_hours`, `sweeper.search.budget`): each trial's
GPU-hours, the trials never started past the budget, the dry run's expected split over the node
counts, and what `sweep run` says it spent."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from sweeper.plan.plan import make_plan
from sweeper.search.budget import expected_split, spent_gpu_hours, trial_gpu_hours
from sweeper.spec.loader import parse_sweep
from tests.conftest import base_spec, sweep_cli

SPACE = {"tp": [1, 2, 4], "pp": [1, 2], "micro_batch_size": [1, 2], "attention": ["flash2"]}


def _spec(tmp_path, **extra) -> dict:
    return (
        base_spec(
            name="budget",
            results_dir=str(tmp_path / "results"),
            space=SPACE,
            cluster={"nodes": [8, 16], "gpus_per_node": 8, "gpu": "a100-80gb"},
            goal={"tokens": 1.0e12, "gpu_hour_cost": 2.0},
            trial={"steps": 10, "warmup_steps": 1, "timeout_min": 20},
        )
        | extra
    )


def test_a_trials_gpu_hours_are_its_gpus_times_start_up_and_steps_at_most_its_time_limit(tmp_path):
    trial = parse_sweep(yaml.safe_dump(_spec(tmp_path))).trial
    got = trial_gpu_hours(np.array([64, 128]), np.array([20.0, 200.0]), trial, startup_s=120.0)
    assert got[0] == pytest.approx(64 * (120 + 10 * 20) / 3600)
    assert got[1] == pytest.approx(128 * 20 * 60 / 3600)  # 120 s + 2000 s: the 20-minute limit
    rows = [
        {"nodes": 8, "step_time_mean_s": 20.0, "step_times_s": [20.0] * 10, "startup_s": 60.0},
        {"nodes": 16, "step_time_mean_s": 10.0},  # a mean only: all 10 steps
        {"nodes": 16, "step_time_mean_s": 10.0, "step_times_s": [10.0] * 4},  # stopped after 4
        {"nodes": 8, "step_time_mean_s": None},  # out of memory: its start-up alone
    ]
    want = (64 * (60 + 200) + 128 * (120 + 100) + 128 * (120 + 40) + 64 * 120) / 3600
    assert spent_gpu_hours(rows, 8, trial, startup_s=120.0) == pytest.approx(want)


@pytest.mark.parametrize("value", [0, -3, "lots", True, ".inf", 2.0e9])
def test_a_bad_budget_is_one_line_naming_the_field(tmp_path, value):
    text = yaml.safe_dump(_spec(tmp_path, search={"max_gpu_hours": 1}))
    text = text.replace("max_gpu_hours: 1", f"max_gpu_hours: {value}")
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    r = sweep_cli("run", str(path), "--dry-run", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    lines = [line for line in (r.stdout + r.stderr).splitlines() if "max_gpu_hours" in line]
    assert len(lines) == 1 and "allowed: a number of GPU-hours above 0" in lines[0]
    assert not (tmp_path / "results").exists()


def _table(tmp_path, spec: dict) -> str:
    """Every candidate at the model's step time x 1.2."""
    plan = make_plan(parse_sweep(yaml.safe_dump(spec)))
    rows = [
        plan.layout(int(r)).as_dict()
        | {"nodes": int(plan.nodes[r]), "status": "ok", "step_time_mean_s": 1.2 * float(plan.throughput.total[r])}
        for r in np.flatnonzero(plan.candidate_mask)
    ]
    path = tmp_path / "table.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def test_the_search_never_starts_a_trial_that_would_overrun_the_budget_and_says_what_it_spent(tmp_path):
    spec = _spec(tmp_path)
    table = _table(tmp_path, spec)
    t = pd.read_csv(table)
    one = (t.nodes * 8 * 10 * t.step_time_mean_s / 3600).min()  # the cheapest trial (a replay: no start-up)
    budget = round(3.5 * float(one), 3)  # room for three trials at most
    spec |= {"search": {"max_trials": 30, "max_gpu_hours": budget, "seed": 0}}
    spec |= {"launcher": {"kind": "replay", "table": table}}
    path = tmp_path / "budget.yaml"
    path.write_text(yaml.safe_dump(spec))

    dry = sweep_cli("run", str(path), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr[-2000:]
    said = " ".join(dry.stdout.split())
    assert f"budget: search.max_gpu_hours {budget:g}: expected split 8 node(s)" in said
    plan = json.loads(sweep_cli("run", str(path), "--dry-run", "--json", cwd=tmp_path).stdout)
    split = plan["estimate"]["budget_split"]
    assert [s["nodes"] for s in split] == [8, 16] and plan["estimate"]["max_gpu_hours"] == budget
    assert 1 <= sum(s["trials"] for s in split) <= 3 and sum(s["gpu_hours"] for s in split) <= budget

    r = sweep_cli("run", str(path), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    df = pd.read_parquet(tmp_path / "results" / "budget" / "trials")
    spent = float((df.nodes * 8 * 10 * df.step_time_mean_s / 3600).sum())
    assert 1 <= len(df) <= 3 and spent <= budget
    said = " ".join((r.stdout + r.stderr).split())  # the closing notes are on stderr
    assert f"search.max_gpu_hours {budget:g}: no trial started that would overrun it" in said
    assert f"GPU-hours spent: {spent:.3g} by {len(df)} trial(s)" in said
    assert f"of search.max_gpu_hours {budget:g}" in said


def test_the_expected_split_spends_no_more_than_the_budget_and_favours_the_cheaper_trials(tmp_path):
    # llama-13b at 8 and 16 nodes: a 16-node trial takes about twice the GPU-hours with 2 min of start-up
    sweep = parse_sweep(yaml.safe_dump(_spec(tmp_path, search={"max_trials": 40, "max_gpu_hours": 40})))
    shares = expected_split(make_plan(sweep), startup_s=120.0)
    assert [s.nodes for s in shares] == [8, 16]
    assert sum(s.gpu_hours for s in shares) <= 40 and all(s.trials >= 1 for s in shares)
    unlimited = parse_sweep(yaml.safe_dump(_spec(tmp_path, search={"max_trials": 40})))
    assert sum(s.gpu_hours for s in expected_split(make_plan(unlimited), startup_s=120.0)) > 40
