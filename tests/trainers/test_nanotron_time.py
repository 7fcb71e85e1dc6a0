"""nanotron's step-time traits: the pipeline stall (`perfmodel.PipelineStall`) and its fp32 loss's
traffic, each priced only where it is named, and the built-in trainer's step times unchanged."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from sweeper.estimate.predict import predict
from sweeper.layouts.layout import Layout, with_derived
from sweeper.spec.sweep import Sweep
from sweeper.spec.traits import PipelineStall
from sweeper.trainers import TRAINERS
from sweeper.trainers.nanotron import NANOTRON_TIME
from tests.conftest import make_sweep

NANOTRON = {"kind": "nanotron", "command": "torchrun run_train.py --config-file cfg.yaml"}
LAYOUTS = [
    Layout(tp=2, pp=1, micro_batch_size=1, sharding="zero1"),
    Layout(tp=2, pp=4, micro_batch_size=1, sharding="zero1"),
    Layout(tp=8, pp=2, micro_batch_size=2, sharding="none", sequence_parallel=True),
]


def sweep_on(nodes: int, **extra: Any) -> Sweep:
    cluster = {"nodes": nodes, "gpus_per_node": 8, "gpu": "h100-sxm"}
    return make_sweep(cluster=cluster, model="llama-7b", seq_len=4096, global_batch_size=256, **extra)


def columns(sweep: Sweep) -> dict[str, np.ndarray]:
    raw = {k: np.asarray([getattr(lay, k) for lay in LAYOUTS]) for k in LAYOUTS[0].as_dict()}
    return with_derived(raw, sweep)


def test_the_built_in_trainers_step_times_are_unchanged():
    # predict(...).total of these layouts at main 7ceec51, before the stall and the loss's traffic
    s = sweep_on(64)
    assert s.trainer is TRAINERS["builtin"]
    assert predict(columns(s), s).total.tolist() == pytest.approx(
        [1.9450694049381168, 0.4437181049753106, 0.39642852015230723], rel=1e-12
    )
    assert TRAINERS["builtin"].time.pp_stall is None and TRAINERS["builtin"].time.loss_traffic_per_logit == 0.0


def test_the_stalled_share_grows_with_the_nodes():
    stall = NANOTRON_TIME.pp_stall
    assert stall is not None and stall.priced == "typical"
    shares = [stall.share(n) for n in (1, 2, 4, 8, 16, 32, 64)]
    assert shares == sorted(shares)
    # the fit's logistic: half at 33.9 nodes, width 14.6
    assert shares[0] == pytest.approx(0.0951, abs=1e-3)
    assert shares[4] == pytest.approx(0.2269, abs=1e-3)
    assert shares[5] == pytest.approx(0.4675, abs=1e-3)
    assert shares[6] == pytest.approx(0.8871, abs=1e-3)
    # the typical run stalls where most runs do; the expected cost is the share of the stall
    assert [stall.cost_s(n) for n in (1, 16, 32, 64)] == [0.0, 0.0, 0.0, 1.15]
    expected = replace(stall, priced="expected")
    assert [expected.cost_s(n) for n in (1, 64)] == pytest.approx([0.0951 * 1.15, 0.8871 * 1.15], abs=2e-3)
    assert PipelineStall(1.0, 10.0, 1.0).share(10_000.0) == 1.0 and PipelineStall(1.0, 10.0, 1.0).share(-1e4) == 0.0


@pytest.mark.parametrize("priced", ["typical", "expected"])
def test_the_stall_is_paid_per_micro_batch_at_pp_above_one_only(priced):
    traits = replace(NANOTRON_TIME, pp_stall=replace(NANOTRON_TIME.pp_stall, priced=priced))
    for nodes in (16, 64):
        s = sweep_on(nodes, workload=NANOTRON)
        cols = columns(s)
        with_stall = predict(cols, s, traits=traits)
        without = predict(cols, s, traits=replace(traits, pp_stall=None))
        extra = with_stall.total - without.total
        assert traits.pp_stall is not None
        per_mb = traits.pp_stall.cost_s(nodes)
        # none at pp = 1; m x the stall at pp > 1, whatever pp (outside the bubble), as framework time
        assert extra.tolist() == pytest.approx((np.where(cols["pp"] > 1, per_mb, 0.0) * cols["grad_accum"]).tolist())
        assert (with_stall.parts["framework"] - without.parts["framework"]).tolist() == pytest.approx(extra.tolist())
        assert with_stall.parts["bubble"].tolist() == pytest.approx(without.parts["bubble"].tolist())
    # 64 nodes, tp 2, pp 4, dp 64: 4 micro-batches of 1.15 s when priced as the typical run
    if priced == "typical":
        assert float(extra[1]) == pytest.approx(4 * 1.15)


def test_the_loss_traffic_is_its_bytes_over_the_last_stages_logits():
    s = sweep_on(8, workload=NANOTRON)
    cols = columns(s)
    priced = predict(cols, s).parts["memory_bound"]
    bare = predict(cols, s, traits=replace(NANOTRON_TIME, loss_traffic_per_logit=0.0)).parts["memory_bound"]
    # 256 x 4096 tokens on 64 GPUs, 16384 each: a last-stage GPU holds the 32000/tp logits of
    # tp x pp x 16384 tokens, 52 bytes each at 3350 GB/s
    logits = 16384 * cols["pp"] * 32000
    assert (priced - bare).tolist() == pytest.approx((52.0 * logits / 3350e9).tolist())
    assert float(priced[1] - bare[1]) == pytest.approx(0.03255, abs=1e-5)
