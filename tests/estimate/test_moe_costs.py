"""The MoE block's host-side cost (perfmoe.MOE_BLOCK_OVERHEAD_S) in perfmodel.predict: paid per MoE
block per micro-batch as framework time, once more (half) where the forward is recomputed, only by
the MoE blocks of a model with leading dense blocks, and never by a dense model."""

from __future__ import annotations

import numpy as np
import pytest

import sweeper.estimate.moe as perfmoe
from sweeper.estimate.predict import predict
from sweeper.estimate.step_time import LAYER_OVERHEAD_S
from tests.conftest import make_sweep
from tests.estimate.test_moe import MEGATRON, cols_of  # the same Megatron-LM workload and layout columns

# 8 blocks, the first 2 dense: 6 MoE blocks of 8 experts, top-2
SMALL_MOE = {
    "layers": 8,
    "hidden": 1024,
    "heads": 8,
    "kv_heads": 8,
    "ffn": 4096,
    "vocab": 32000,
    "experts": 8,
    "experts_per_token": 2,
    "moe_ffn": 1024,
    "dense_layers": 2,
}


def sweep_of(model, gbs: int = 64):
    return make_sweep(
        model=model,
        seq_len=2048,
        global_batch_size=gbs,
        cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm"},
        space={"tp": [1]},
        workload=MEGATRON,
    )


def test_each_moe_block_pays_it_once_per_micro_batch():
    sweep = sweep_of(SMALL_MOE)
    # dp 8 (ep 8 folds into it): 64 sequences, 8 per rank; micro-batch 1 and 4 -> 8 and 2 micro-batches
    cols = cols_of(sweep, [{"ep": 8, "micro_batch_size": 1}, {"ep": 8, "micro_batch_size": 4}])
    assert list(cols["grad_accum"]) == [8, 2]
    pred = predict(cols, sweep)
    fixed = LAYER_OVERHEAD_S * 8 * cols["grad_accum"] + sweep.trainer.time.microbatch_s * cols["grad_accum"]
    host = pred.parts["framework"] - fixed
    # 6 MoE blocks of 8, 2.75 ms each, per micro-batch: 8 x 16.5 ms and 2 x 16.5 ms
    assert host == pytest.approx([0.132, 0.033], rel=1e-9)
    assert host[0] == pytest.approx(4 * host[1], rel=1e-12)


def test_a_model_without_the_cost_predicts_that_much_less(monkeypatch):
    sweep = sweep_of(SMALL_MOE)
    layouts = [{"ep": ep, "pp": pp, "micro_batch_size": 1} for ep in (1, 2, 4) for pp in (1, 2)]
    cols = cols_of(sweep, layouts)
    with_cost = predict(cols, sweep)
    monkeypatch.setattr(perfmoe, "MOE_BLOCK_OVERHEAD_S", 0.0)
    without = predict(cols, sweep)
    extra = with_cost.parts["framework"] - without.parts["framework"]
    # busiest stage: 8 blocks at pp 1, 4 at pp 2; three quarters of blocks are MoE on average
    busiest = np.where(cols["pp"] == 1, 8, 4)
    assert extra == pytest.approx(2.75e-3 * 0.75 * busiest * cols["grad_accum"], rel=1e-9)
    # it is work: the bubble grows by its (pp-1)/(v*m) share (1/m at pp 2)
    bubble = with_cost.parts["bubble"] - without.parts["bubble"]
    assert bubble == pytest.approx(np.where(cols["pp"] == 2, extra / cols["grad_accum"], 0.0), rel=1e-9, abs=1e-15)
    # every other part but the data-parallel overlap (behind the last backward, a share of the work) is untouched
    for k in with_cost.parts:
        if k not in ("framework", "bubble", "dp_comm", "dp_hidden"):
            assert np.array_equal(with_cost.parts[k], without.parts[k]), k


def test_recomputing_the_forward_pays_half_of_it_again(monkeypatch):
    sweep = sweep_of(SMALL_MOE)
    modes = ("none", "full", "ffn", "selective")
    cols = cols_of(sweep, [{"ep": 4, "micro_batch_size": 2, "activation_checkpointing": m} for m in modes])
    with_cost = predict(cols, sweep).parts["recompute"]
    monkeypatch.setattr(perfmoe, "MOE_BLOCK_OVERHEAD_S", 0.0)
    without = predict(cols, sweep).parts["recompute"]
    host = 2.75e-3 * 6 * cols["grad_accum"]  # 6 MoE blocks per micro-batch
    assert with_cost - without == pytest.approx(np.where(np.isin(modes, ("full", "ffn")), 0.5 * host, 0.0), abs=1e-12)


def test_a_dense_model_is_unchanged(monkeypatch):
    sweep = sweep_of("llama3-8b")
    layouts = [
        {"tp": tp, "pp": pp, "micro_batch_size": 1, "sequence_parallel": tp > 1} for tp in (1, 2, 4) for pp in (1, 2)
    ]
    cols = cols_of(sweep, layouts)
    before = predict(cols, sweep)
    monkeypatch.setattr(perfmoe, "MOE_BLOCK_OVERHEAD_S", 1.0)
    after = predict(cols, sweep)
    assert np.array_equal(before.total, after.total)
    for k in before.parts:
        assert np.array_equal(before.parts[k], after.parts[k]), k
