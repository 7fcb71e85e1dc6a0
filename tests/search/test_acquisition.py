"""Uncertain is not impossible: a layout whose memory estimate is over the card by less than the
estimate's measured error is tried (weighed by its chance to fit), not pruned; far over, it is pruned."""

from __future__ import annotations

import numpy as np

from sweeper.estimate.memfit import MEMORY_LOG_SIGMA, MIN_FIT_CHANCE, fit_chance
from sweeper.plan.plan import make_plan
from sweeper.search.acquisition import best_chance
from sweeper.search.build import build_search
from tests.conftest import make_sweep


def _card_for(share_over: float, **overrides):
    """A one-layout sweep whose card is sized so the estimate is `share_over` above its usable memory."""
    probe = make_plan(make_sweep(space={"tp": [8], "pp": [1], "micro_batch_size": [1]}, **overrides))
    need = float(probe.memory.total[0]) / 2**30 / (1 + share_over)
    gib = need / 0.95  # the default headroom keeps 5 % of the card free
    return make_plan(
        make_sweep(
            space={"tp": [8], "pp": [1], "micro_batch_size": [1]},
            cluster={"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": gib, "peak_tflops": 312}},
            **overrides,
        )
    )


def test_fit_chance_follows_the_measured_error():
    chance = fit_chance(np.array([0.9, 1.0, 1.1, 2.0]), 1.0)
    assert chance[1] == 0.5 and chance[0] > 0.8 and 0.1 < chance[2] < 0.5 and chance[3] < 1e-6
    # the band: over the card by up to ~30 % is uncertain, beyond it pruned
    edge = float(np.exp(2.326 * MEMORY_LOG_SIGMA))
    assert fit_chance(np.array([edge * 0.99]), 1.0)[0] > MIN_FIT_CHANCE > fit_chance(np.array([edge * 1.01]), 1.0)[0]


def test_a_layout_within_the_error_band_is_tried_not_pruned():
    plan = _card_for(0.08)
    mem = plan.memory
    assert mem.total[0] > mem.capacity_bytes  # over the card by the estimate
    assert plan.status[0] == "uncertain" and plan.reason_code[0] == "memory_uncertain"
    assert "chance it fits" in plan.reason[0]
    assert plan.candidate_mask[0] and 0.01 < plan.fit_chance[0] < 0.5
    assert plan.reason_counts() == {}  # not a rejection
    search = build_search(plan, sampler="auto", max_trials=5, seed=0)
    p = search.ask()
    assert p is not None and p.row == 0
    search.tell(p.optuna_trial, p.row, status="oom", mfu=None)  # it did not fit after all: an OOM teaches
    assert search.ask() is None


def test_a_layout_far_over_the_card_is_pruned():
    plan = _card_for(0.6)
    assert plan.status[0] == "pruned" and plan.reason_code[0] == "memory"
    assert not plan.candidate_mask.any()


def test_the_search_weighs_an_uncertain_layout_by_its_chance():
    # two layouts; the uncertain one is predicted faster, but its chance to fit is small
    plan = make_plan(
        make_sweep(space={"tp": [1, 2, 4, 8], "pp": [1], "micro_batch_size": [1, 2]}, memory={"headroom": 0.0})
    )
    search = build_search(plan, sampler="auto", max_trials=20, seed=0)
    rows = np.flatnonzero(plan.candidate_mask)
    # the chance to run and be the best per trial spent (sweeper.search.acquisition), nothing measured yet
    expected = best_chance(np.log(search.learning.pred_mfu[rows]), plan.fit_chance[rows], np.zeros(0))
    first = search.ask()
    assert first is not None and first.row == rows[np.argmax(expected)]
    assert plan.status[first.row] == "candidate"  # not the faster uncertain layout, whose chance is small


def _order(plan) -> list[int]:
    """The rows in the order the search runs them, each measured at the model's own prediction."""
    search = build_search(plan, sampler="auto", max_trials=len(plan), seed=0)
    order = []
    while (p := search.ask()) is not None:
        order.append(p.row)
        step = float(plan.throughput.total[p.row])  # the model is right: nothing reorders what is left
        search.tell(p.optuna_trial, p.row, status="ok", mfu=float(plan.pred_mfu[p.row]), step_time_s=step)
    return order


def _edge_plan(share_over: float):
    """LLaMA-7B at 8k: no model parallelism (tp = pp = 1) is the predicted best, `share_over` above a card
    that every other layout fits (pipeline at tp 1: 3 % slower; tensor parallel 4 and 8: 14-31 %)."""
    space = {"tp": [1, 4, 8], "pp": [1, 4], "micro_batch_size": [1], "sharding": ["zero1"]}
    probe = make_plan(make_sweep(model="llama-7b", seq_len=8192, space=space, memory={"headroom": 0.0}))
    gib = float(probe.memory.total[0]) / 2**30 / (1 + share_over)  # row 0: tp = pp = 1
    card = {"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": gib, "peak_tflops": 312}}
    plan = make_plan(make_sweep(model="llama-7b", seq_len=8192, space=space, memory={"headroom": 0.0}, cluster=card))
    certain = np.flatnonzero(plan.status == "candidate")
    assert plan.status[0] == "uncertain" and certain.size == 5
    assert plan.pred_mfu[0] > plan.pred_mfu[certain].max()  # the predicted best
    return plan, certain


def test_an_uncertain_layout_predicted_best_runs_early():
    plan, certain = _edge_plan(0.03)
    assert 0.3 < plan.fit_chance[0] < 0.5
    # expected speed times the chance to fit put it behind every certain layout (last of 6)
    assert plan.pred_mfu[0] * plan.fit_chance[0] < plan.pred_mfu[certain].min()
    order = _order(plan)
    assert order.index(0) <= 1, order  # first or second: after at most the pipelined layout 3 % behind it


def test_an_uncertain_layout_whose_chance_is_tiny_does_not_jump_the_queue():
    plan, certain = _edge_plan(0.25)
    assert plan.fit_chance[0] < 0.05
    order = _order(plan)
    assert order.index(0) == len(certain), order  # after every layout certain to fit, 14-31 % slower ones too
