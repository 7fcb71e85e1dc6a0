"""The throughput model ranks layouts the way the physics says, and calibrates to measurements."""

from __future__ import annotations

import numpy as np
import pytest

from sweeper.estimate.predict import predict
from sweeper.estimate.step_time import calibrate
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.search.learn import needs_at_least
from tests.conftest import make_sweep

BIG = {"nodes": 8, "gpus_per_node": 8, "gpu": "a100-80gb"}


def mfu(layout: Layout, **kw) -> float:
    s = make_sweep(**kw)
    return float(predict(layout.columns(s), s).mfu[0])


def test_mfu_is_a_plausible_share_of_peak():
    assert 0.3 < mfu(Layout(tp=2, pp=2, attention="flash2")) < 0.8


def test_bubble_shrinks_with_micro_batches_and_interleaving():
    one_f_one_b = mfu(Layout(pp=4, micro_batch_size=8), global_batch_size=512)  # 4 micro-batches
    more = mfu(Layout(pp=4, micro_batch_size=1), global_batch_size=512)  # 32 micro-batches
    assert more > one_f_one_b
    inter = mfu(Layout(pp=4, micro_batch_size=8, pp_schedule="interleaved", virtual_stages=2), global_batch_size=512)
    assert inter > one_f_one_b


def test_kernels_and_recomputation():
    assert mfu(Layout(attention="flash2")) > mfu(Layout(attention="flash1")) > mfu(Layout(attention="eager"))
    assert mfu(Layout(rmsnorm="fused")) > mfu(Layout(rmsnorm="eager"))
    assert mfu(Layout(activation_checkpointing="none")) > mfu(Layout(activation_checkpointing="full"))
    assert mfu(Layout(compile=True)) > mfu(Layout(compile=False))


def test_tensor_parallel_costs_and_sequence_parallel_helps():
    assert mfu(Layout(tp=1)) > mfu(Layout(tp=8))
    assert mfu(Layout(tp=8, sequence_parallel=True)) > mfu(Layout(tp=8))


def test_calibration_recovers_scales():
    s = make_sweep(space={"tp": [1, 2, 4, 8], "pp": [1, 2, 4]})
    plan = make_plan(s)
    pred = predict(plan.cols, s)
    rows = [int(r) for r in np.flatnonzero(plan.candidate_mask)[:6]]
    measured = [1.3 * pred.compute[r] + 2.0 * pred.comm[r] for r in rows]
    cal = calibrate(pred, rows, measured)
    assert cal.compute_scale == pytest.approx(1.3, rel=1e-6) and cal.comm_scale == pytest.approx(2.0, rel=1e-6)
    one = calibrate(pred, rows[:1], measured[:1])
    assert one.compute_scale == one.comm_scale and one.trials == 1


def test_an_oom_rules_out_layouts_that_need_more_memory():
    s = make_sweep(
        cluster={"nodes": 8, "gpus_per_node": 8, "gpu": {"memory_gib": 10000, "peak_tflops": 1}},
        space={
            "tp": [2],
            "micro_batch_size": [1, 2, 4],
            "activation_checkpointing": ["none", "ffn", "selective", "full"],
            "sequence_parallel": [False, True],
        },
    )
    plan = make_plan(s)
    rows = np.flatnonzero(plan.candidate_mask)
    ref = next(
        int(r)
        for r in rows
        if plan.layout(int(r))
        == Layout(tp=2, micro_batch_size=2, activation_checkpointing="ffn", sequence_parallel=True)
    )
    hungrier = {plan.layout(int(r)) for r in rows[needs_at_least(plan.cols, rows, ref)]}
    assert Layout(tp=2, micro_batch_size=4, activation_checkpointing="none", sequence_parallel=False) in hungrier
    assert Layout(tp=2, micro_batch_size=2, activation_checkpointing="ffn", sequence_parallel=False) in hungrier
    assert Layout(tp=2, micro_batch_size=1, activation_checkpointing="ffn", sequence_parallel=True) not in hungrier
    assert (
        Layout(tp=2, micro_batch_size=4, activation_checkpointing="selective", sequence_parallel=True) not in hungrier
    )
    assert Layout(tp=2, micro_batch_size=4, activation_checkpointing="full", sequence_parallel=True) not in hungrier
