"""Uncertain is not impossible: a layout whose memory estimate is over the card by less than the
estimate's measured error is tried (weighed by its chance to fit), not pruned; far over, it is pruned."""

from __future__ import annotations

import numpy as np

from sweeper.memfit import MEMORY_LOG_SIGMA, MIN_FIT_CHANCE, fit_chance
from sweeper.plan import make_plan
from sweeper.search import build_search
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
    expected = search.learning.pred_mfu[rows] * plan.fit_chance[rows]
    first = search.ask()
    assert first is not None and first.row == rows[np.argmax(expected)]
