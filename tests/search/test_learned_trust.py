"""A learned profile never makes a sweep stop later or run longer: once the sweep's own trials contradict
it, the search chooses, predicts and stops as it does without one (issue: learning across sweeps,
proven on recorded sweeps). Over the search alone (`build_search`), with the model's step times as truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from sweeper.estimate.step_time import Calibration
from sweeper.plan.plan import Plan, make_plan
from sweeper.results.identity import sweep_identity
from sweeper.search.build import build_search
from sweeper.search.learned import LearnedKey, Lessons, save
from sweeper.search.prior import LearnedEffect
from sweeper.search.remember import Memory
from sweeper.search.search import LayoutSearch
from sweeper.spec.loader import parse_sweep

SPACE = {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2, 4], "sharding": ["none", "zero1"]}


def _plan_and_prior(tmp: Path, effects: dict[Any, LearnedEffect], **search: Any) -> tuple[Plan, Any]:
    spec = {
        "name": "later",
        "model": "llama-13b",
        "seq_len": 2048,
        "global_batch_size": 2048,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "a100-80gb"},
        "space": SPACE,
        "memory": {"headroom": 0.0},
        "results_dir": str(tmp / "results"),
        "search": {"max_trials": 40, **search},
    }
    sweep = parse_sweep(yaml.safe_dump(spec))
    earlier = Lessons("0123456789abcdef", "earlier", "llama-13b", 8, "2025-01-01T00:00:00+00:00", 12, 12,
                      Calibration(1.0, 1.0, 12), effects, None)  # fmt: skip
    save(LearnedKey.of(sweep), earlier)
    prior = Memory.of(sweep, sweep_id=sweep_identity(sweep), cluster_name=None, enabled=True).prior
    assert prior is not None
    return make_plan(sweep), prior


def _tell(search: LayoutSearch, plan: Plan, row: int) -> None:
    """The layout ran exactly as the model says (the truth here: the learned profile is wrong)."""
    step = float(plan.throughput.total[row])
    search.observe(row, status="ok", mfu=float(plan.pred_mfu[row]), step_time_s=step)


def test_a_contradicted_learned_profile_chooses_and_stops_as_without_it(tmp_path):
    """The profile says every pp=2 layout runs 3x faster than the model says (which would keep a sweep
    with a stop margin going: untried pp=2 layouts look 3x better than the best); the sweep measures
    pp=2 at the model's speed. From then on its choices, predictions and stop are the plain search's."""
    plan, prior = _plan_and_prior(tmp_path, {("pp", 2): LearnedEffect(float(np.log(1 / 3)), 4)}, stop_margin=0.02)
    plain = build_search(plan, sampler="auto", max_trials=40)
    seeded = build_search(plan, sampler="auto", max_trials=40, prior=prior)
    assert seeded.effects is not None and seeded.effects.trust == 1.0
    first = seeded.choose()
    assert first is not None and plan.cols["pp"][first] == 2  # the learned profile moved the first choice
    seeded.running.discard(first)
    rows = np.flatnonzero(plan.status == "candidate")
    pp2 = rows[plan.cols["pp"][rows] == 2]
    other = rows[plan.cols["pp"][rows] != 2]
    best = other[np.argsort(plan.throughput.total[other])]
    told = [int(pp2[0]), int(best[0]), int(pp2[1]), int(best[1])]
    for r in told:
        _tell(plain, plan, r)
        _tell(seeded, plan, r)
    assert seeded.effects.trust == pytest.approx(0.0, abs=0.02)
    assert seeded.calibration.compute_scale == pytest.approx(plain.calibration.compute_scale, rel=0.01)
    assert seeded.pred_mfu[rows] == pytest.approx(plain.pred_mfu[rows], rel=0.02)
    assert seeded.should_stop() == plain.should_stop()
    # the sweep goes on as the plain one does: the same next choices, the same stop, within the same budget
    for _ in range(6):
        if plain.should_stop():
            break
        a, b = plain.choose(), seeded.choose()
        assert a == b
        if a is None:
            break
        _tell(plain, plan, a)
        _tell(seeded, plan, b)
    assert seeded.should_stop() == plain.should_stop()
    assert len(seeded.done) == len(plain.done) <= 40


def test_a_learned_profile_the_trials_bear_out_keeps_its_say(tmp_path):
    """The same profile on a sweep where pp=2 does run 3x faster: the trust stays, and it is used."""
    plan, prior = _plan_and_prior(tmp_path, {("pp", 2): LearnedEffect(float(np.log(1 / 3)), 4)})
    seeded = build_search(plan, sampler="auto", max_trials=40, prior=prior)
    rows = np.flatnonzero(plan.status == "candidate")
    pp2 = rows[plan.cols["pp"][rows] == 2]
    other = rows[plan.cols["pp"][rows] != 2]
    for r in (int(pp2[0]), int(other[0]), int(pp2[1])):
        step = float(plan.throughput.total[r]) / (3.0 if r in pp2 else 1.0)
        seeded.observe(r, status="ok", mfu=None, step_time_s=step)
    assert seeded.effects is not None and seeded.effects.trust > 0.9
