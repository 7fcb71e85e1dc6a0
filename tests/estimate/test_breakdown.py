"""perfmodel.breakdown: the step split into the parts the report draws, consistent with `predict`
and with the published formulas each part stands for."""

from __future__ import annotations

import numpy as np
import pytest

from sweeper.estimate.comm import TWO_NODE_ALLREDUCE
from sweeper.estimate.predict import breakdown, predict
from sweeper.estimate.step_time import PARTS, Calibration
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import make_plan
from sweeper.spec.traits import MEGATRON_LIKE
from tests.conftest import make_sweep

EXPOSED = [k for k in PARTS if k != "dp_hidden"]


@pytest.mark.parametrize("calibration", [Calibration(), Calibration(1.7, 0.6, 3)])
def test_exposed_parts_add_up_to_the_predicted_step(calibration):
    sweep = make_sweep(
        space={
            "tp": [1, 2, 4, 8],
            "pp": [1, 2, 4],
            "micro_batch_size": [1, 2, 4],
            "activation_checkpointing": ["none", "ffn", "full"],
            "attention": ["flash2", "eager"],
            "sharding": ["none", "fsdp"],
        }
    )
    plan = make_plan(sweep)
    rows = plan.candidate_mask
    parts = breakdown(plan.cols, sweep, calibration)
    total = sum(parts[k] for k in EXPOSED)
    step = predict(plan.cols, sweep, calibration).total
    assert rows.sum() > 50
    assert np.allclose(total[rows], step[rows], rtol=1e-12)
    assert all((parts[k][rows] >= 0).all() for k in PARTS)


def one(layout: Layout, **spec) -> dict[str, float]:
    sweep = make_sweep(**spec)
    return {k: float(v[0]) for k, v in breakdown(layout.columns(sweep), sweep).items()}


def test_bubble_is_the_1f1b_fraction_of_the_work():
    # Narayanan et al. 2021 (Megatron-LM, SC'21), section 2.2.1: with p stages and m micro-batches the
    # 1F1B/GPipe bubble is (p - 1) / m of the ideal compute time.
    p = one(Layout(tp=4, pp=4, micro_batch_size=2), global_batch_size=64)  # dp=4: m = 64 / (2 * 4) = 8
    work = sum(p[k] for k in ("matmul", "attention", "memory_bound", "framework", "recompute"))
    assert p["bubble"] / work == pytest.approx(3 / 8)
    assert one(Layout(tp=4, pp=1), global_batch_size=64)["bubble"] == 0.0


def test_full_recomputation_is_one_more_forward_of_the_blocks():
    # Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    # section 5: full recomputation runs each block's forward again, a third more than fwd + bwd.
    sweep = make_sweep()
    m = sweep.model
    p = one(Layout(tp=4, activation_checkpointing="full", attention="flash2"))
    blocks_share = m.layers * m.layer_params / m.num_params  # matmul time also covers embedding and head
    # the per-block launch cost is paid again; the per-micro-batch fixed cost is not
    accum = int(Layout(tp=4).columns(sweep)["grad_accum"][0])
    launches = p["framework"] - MEGATRON_LIKE.microbatch_s * accum
    expected = p["matmul"] * blocks_share / 3 + p["attention"] / 3 + 0.5 * launches
    assert p["recompute"] == pytest.approx(expected, rel=1e-9)
    assert one(Layout(tp=4, activation_checkpointing="none"))["recompute"] == 0.0
    # the forward is a third of the first pass's matmuls and attention: full recompute is ~all of it
    assert 0.85 < p["recompute"] / p["forward"] < 1.0


def test_ddp_reduction_splits_into_exposed_and_hidden_ring_all_reduce():
    # ring all-reduce (Patarasuk & Yuan 2009): each rank moves 2 (n - 1) / n of the buffer; fp32 grads
    sweep = make_sweep()
    layout = Layout(tp=8, pp=1)  # dp = 8 across nodes
    cols = layout.columns(sweep)
    p = one(layout)
    nbytes = 4.0 * sweep.model.num_params / 8  # this rank's fp32 gradients under tp=8
    # one member per node: its own NIC, at the 2-node efficiency the ultrascale cluster measured
    ring = 2 * 7 / 8 * nbytes / (sweep.cluster.gpu.inter_gbps * TWO_NODE_ALLREDUCE * 1e9)
    assert p["dp_comm"] + p["dp_hidden"] == pytest.approx(ring, rel=0.05)  # tp-replicated norms: ~1 % more
    assert p["dp_hidden"] > 0 and int(cols["dp"][0]) == 8
