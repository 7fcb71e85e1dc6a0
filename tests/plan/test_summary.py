"""The dry run's records (`sweeper.plan.summary`): counts that add up, reasons that name the value
and the limit, the reason that removed the most, and the sweep's estimated cost."""

from __future__ import annotations

import math

import numpy as np

from sweeper.plan.plan import make_plan
from sweeper.plan.summary import TRIAL_STARTUP_S, cost_estimate, no_candidates_message, plan_counts, top_reason
from sweeper.spec.loader import load_sweep
from tests.conftest import SPACES, make_sweep

HUGE = {"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": 100000, "peak_tflops": 100}}


def test_counts_add_up_to_the_cross_product_and_reasons_to_the_invalid():
    plan = make_plan(load_sweep(SPACES / "llama13b_2k.yaml"))
    counts = plan_counts(plan)
    by_status = {s.status: s for s in counts.statuses}
    assert [s.status for s in counts.statuses] == ["candidate", "uncertain", "pruned", "invalid"]
    assert sum(s.count for s in counts.statuses) == counts.layouts == len(plan) == 2048
    assert {k: s.count for k, s in by_status.items()} == {k: int((plan.status == k).sum()) for k in by_status}
    assert by_status["uncertain"].count == 95 and counts.runnable == 896 + 95
    invalid = by_status["invalid"]
    assert sum(r.count for r in invalid.reasons) == invalid.count == 704
    assert [(r.code, r.count) for r in invalid.reasons] == [("kernel_not_in_workload", 512), ("duplicate", 192)]


def test_a_reason_with_several_values_gives_a_line_per_value_then_folds():
    # dp = 64: micro-batches of 3 and 5 do not divide 2048 sequences, each in its own words
    sweep = make_sweep(space={"micro_batch_size": [1, 3, 5]}, cluster=HUGE)
    reasons = plan_counts(make_plan(sweep)).statuses[-1].reasons
    assert [(r.code, r.count) for r in reasons] == [("batch_not_divisible", 1), ("batch_not_divisible", 1)]
    assert [r.text for r in reasons] == [
        "micro_batch_size*dp does not divide the global batch: micro_batch_size*dp = 3*64 does not divide "
        "global_batch_size = 2048",
        "micro_batch_size*dp does not divide the global batch: micro_batch_size*dp = 5*64 does not divide "
        "global_batch_size = 2048",
    ]
    many = make_sweep(global_batch_size=2048 * 3, space={"micro_batch_size": [5, 7, 9, 11, 13]}, cluster=HUGE)
    lines = plan_counts(make_plan(many)).statuses[-1].reasons
    assert len(lines) == 3 and sum(r.count for r in lines) == 5
    assert lines[-1].text == (
        "micro_batch_size*dp does not divide the global batch: 3 more cases (--out gives each layout's reason)"
    )


def test_a_mixture_of_experts_under_the_builtin_trainer_is_refused_for_tp_not_etp():
    space = {"tp": [1, 2, 4], "etp": [1], "micro_batch_size": [1]}
    reasons = plan_counts(make_plan(make_sweep(model="mixtral-8x7b", space=space, cluster=HUGE))).statuses[-1].reasons
    texts = [r.text for r in reasons if r.code == "experts_not_in_workload"]
    assert texts == [
        f"an expert layout the workload's trainer does not run: the builtin trainer runs a mixture of experts only "
        f"with tp = 1, not tp = {tp} (it has no tensor-parallel MoE block; no etp value changes that)"
        for tp in (2, 4)
    ]


def test_the_reason_that_removed_the_most_names_the_value_and_the_limit():
    # 4 GPUs, 8 sequences: micro-batches of 3 never divide them (3 layouts); flash1 is missing here (2 more)
    four = {"nodes": 1, "gpus_per_node": 4, "gpu": {"memory_gib": 100000, "peak_tflops": 100}}
    space = {"micro_batch_size": [1, 2, 3], "attention": ["flash1", "flash2", "eager"]}
    plan = make_plan(make_sweep(global_batch_size=8, space=space, cluster=four))
    top = top_reason(plan)
    assert top is not None and (top.code, top.count) == ("batch_not_divisible", 3)
    assert top.text == (
        "micro_batch_size*dp does not divide the global batch: micro_batch_size*dp = 3*4 does not divide "
        "global_batch_size = 8"
    )
    assert no_candidates_message(plan) == (
        "t: no candidate layout is left after the plan; the reason that removed the most (3 of 9 layouts): " + top.text
    )


def test_memory_as_the_top_reason_names_the_least_hungry_layout_and_the_card():
    tiny = {"nodes": 1, "gpus_per_node": 8, "gpu": {"name": "tiny", "memory_gib": 8, "peak_tflops": 100}}
    plan = make_plan(make_sweep(cluster=tiny, space={"tp": [8], "pp": [1]}, global_batch_size=8))
    assert not plan.candidate_mask.any()
    top = top_reason(plan)
    need = float(np.nanmin(plan.memory.total)) / 1024**3
    assert top is not None and top.code == "memory" and top.count == 1
    assert top.text == (
        f"predicted memory over the card: the least needs {need:.1f} GiB > 7.6 GiB usable on tiny"  # 8 GiB less 5 %
    )


def test_cost_of_trials_capped_by_their_time_limit_is_exact():
    # a one-minute limit under the two minutes of start-up: every trial costs its limit
    sweep = make_sweep(
        trial={"steps": 10, "warmup_steps": 1, "timeout_min": 1}, search={"max_trials": 5, "parallel": 2}
    )
    cost = cost_estimate(make_plan(sweep))
    assert cost.trials == 5 and cost.trial_s == 60.0 and cost.gpus_per_trial == 64
    assert math.isclose(cost.gpu_hours, 5 * 60 * 64 / 3600)
    assert math.isclose(cost.wall_hours, 3 * 60 / 3600)  # three rounds of two at a time


def test_cost_is_the_predicted_step_times_of_the_layouts_it_may_run():
    sweep = make_sweep(search={"max_trials": 1000, "parallel": 4})
    plan = make_plan(sweep)
    cost = cost_estimate(plan)
    runnable = plan.candidate_mask
    assert cost.runnable == cost.trials == int(runnable.sum())  # a budget above them runs them all
    step_s = plan.throughput.total[runnable]
    assert math.isclose(cost.trial_s, float(np.mean(TRIAL_STARTUP_S + 10 * step_s)))
    assert math.isclose(cost.gpu_hours, float(np.sum(TRIAL_STARTUP_S + 10 * step_s)) * 64 / 3600)
    assert math.isclose(cost.wall_hours, math.ceil(cost.trials / 4) * cost.trial_s / 3600)
    assert "every runnable layout" in cost.assumes and "no trial stopped early" in cost.assumes
