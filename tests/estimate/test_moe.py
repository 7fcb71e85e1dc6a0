"""The step time of context-parallel and expert-parallel layouts (sweeper.estimate.moe through
perfmodel.predict): parts still add up, cp divides each rank's attention, the K/V ring hides behind
attention where an all-gather does not, all-to-alls leave NVLink only across its domain, grouped
expert GEMMs run at their own size, and gradients are reduced over dp*cp and over edp."""

from __future__ import annotations

import numpy as np
import pytest

from sweeper.estimate.comm import ALLTOALL_NIC_SHARE, ALLTOALL_NVLINK_SHARE
from sweeper.estimate.moe import EXPERT_IMBALANCE, expert_rows, reduction_groups, routed_flops_per_token
from sweeper.estimate.predict import predict
from sweeper.estimate.step_time import COMM_PARTS, COMPUTE_PARTS, HIDDEN_PARTS, PARTS, gemm_efficiency
from sweeper.layouts.layout import Layout, with_derived
from sweeper.spec.hardware import lookup_gpu
from sweeper.spec.traits import TimeTraits
from tests.conftest import make_sweep

MEGATRON = {"kind": "megatron", "command": "torchrun pretrain_gpt.py {flags}"}


def moe_sweep(nodes: int = 2, gpu: str = "h100-sxm", per_node: int = 8, **extra):
    return make_sweep(
        model="qwen3-30b-a3b",
        seq_len=4096,
        global_batch_size=512,
        cluster={"nodes": nodes, "gpus_per_node": per_node, "gpu": gpu},
        space={"tp": [1]},
        workload=MEGATRON,
        **extra,
    )


def dense_sweep(nodes: int = 1, seq_len: int = 8192, **extra):
    return make_sweep(
        model="llama3-8b",
        seq_len=seq_len,
        global_batch_size=64,
        cluster={"nodes": nodes, "gpus_per_node": 8, "gpu": "h100-sxm"},
        space={"tp": [1]},
        workload=MEGATRON,
        **extra,
    )


def cols_of(sweep, layouts: list[dict]):
    lays = [Layout(attention="cudnn", sharding="zero1", **k) for k in layouts]
    raw = {k: np.asarray([getattr(lay, k) for lay in lays]) for k in lays[0].as_dict()}
    return with_derived(raw, sweep)


@pytest.mark.parametrize("traits", [None, TimeTraits(cp_ring=False)])
def test_parts_sum_to_the_total_with_cp_and_ep(traits):
    sweep = moe_sweep(nodes=4)
    layouts = [
        {"tp": tp, "pp": pp, "cp": cp, "ep": ep, "micro_batch_size": 1, "sequence_parallel": tp > 1}
        for tp in (1, 2)
        for pp in (1, 2)
        for cp in (1, 2)
        for ep in (1, 4, 16)
    ]
    cols = cols_of(sweep, layouts)
    pred = predict(cols, sweep, traits=traits)
    assert set(pred.parts) == set(PARTS) == set(COMPUTE_PARTS) | set(COMM_PARTS) | set(HIDDEN_PARTS)
    assert np.allclose(sum(pred.parts[k] for k in COMPUTE_PARTS), pred.compute, rtol=1e-12)
    assert np.allclose(sum(pred.parts[k] for k in COMM_PARTS), pred.comm, rtol=1e-12)
    exposed = sum(pred.parts[k] for k in PARTS if k not in HIDDEN_PARTS)
    assert np.allclose(exposed, pred.total, rtol=1e-12)
    assert all((pred.parts[k] >= 0).all() and np.isfinite(pred.parts[k]).all() for k in PARTS)
    # no dispatch traffic only where the experts are neither split (ep) nor tensor-parallel (etp follows tp)
    alone = (cols["ep"] == 1) & (cols["etp"] == 1)
    assert alone.any() and (pred.parts["ep_comm"][alone] == 0).all() and (pred.parts["ep_comm"][~alone] > 0).all()
    assert (pred.parts["expert_matmul"] > 0).all()


def test_a_dense_model_has_no_expert_parts_and_cp1_no_exchange():
    sweep = dense_sweep()
    pred = predict(cols_of(sweep, [{"tp": 2, "sequence_parallel": True}]), sweep)
    for k in ("expert_matmul", "ep_comm", "cp_comm", "cp_hidden"):
        assert pred.parts[k][0] == 0.0, k


def test_cp2_halves_the_attention_of_each_rank():
    sweep = dense_sweep()
    cols = cols_of(sweep, [{"cp": 1}, {"cp": 2}])
    parts = predict(cols, sweep).parts
    # per micro-batch: a rank holds half of each sequence (seq/cp tokens), each attending to all of it
    per_mb = parts["attention"] / cols["grad_accum"]
    assert per_mb[1] == pytest.approx(per_mb[0] / 2, rel=1e-12)
    # on twice the GPUs at the same dp, the step's attention per rank halves
    wide = dense_sweep(nodes=2)
    assert predict(cols_of(wide, [{"cp": 2}]), wide).parts["attention"][0] == pytest.approx(parts["attention"][0] / 2)
    # every per-token term counts seq/cp tokens: the GEMMs are those of half a sequence
    half = cols_of(dense_sweep(seq_len=4096), [{"cp": 1}])
    assert gemm_efficiency(cols, sweep)[1] == pytest.approx(gemm_efficiency(half, dense_sweep(seq_len=4096))[0])


def test_the_ring_hides_behind_attention_and_the_all_gather_does_not():
    sweep = dense_sweep(seq_len=65536)
    cols = cols_of(sweep, [{"cp": 8}])
    ring = predict(cols, sweep).parts
    gathered = predict(cols, sweep, traits=TimeTraits(cp_ring=False)).parts
    # 64k tokens: each K/V transfer is far shorter than the attention of the chunk in flight
    assert ring["cp_comm"][0] == 0.0 and ring["cp_hidden"][0] > 0
    assert gathered["cp_hidden"][0] == 0.0 and gathered["cp_comm"][0] > 0
    # a ring's raw K/V volume: (cp-1) chunks of this rank's K and V per pass, 3 passes per block
    m, e = sweep.model, 2.0
    chunk = 65536 / 8 * 2 * m.kv_dim * e
    moves = m.layers * int(cols["grad_accum"][0]) * 3
    seconds = moves * 7 * (chunk / (450e9) + 15e-6)
    assert ring["cp_hidden"][0] == pytest.approx(seconds, rel=1e-9)


def test_a_cp_group_across_nodes_exchanges_over_the_nic():
    sweep = dense_sweep(nodes=2, seq_len=16384)
    cols = cols_of(
        sweep, [{"tp": 4, "cp": 2, "sequence_parallel": True}, {"tp": 8, "cp": 2, "sequence_parallel": True}]
    )
    p = predict(cols, sweep, traits=TimeTraits(cp_ring=False)).parts
    inside, across = p["cp_comm"] / cols["grad_accum"] * cols["tp"]  # per micro-batch, per K/V head
    assert across > 3 * inside


def test_an_ep_all_to_all_across_nodes_costs_more_than_within():
    sweep = moe_sweep(nodes=2)
    cols = cols_of(sweep, [{"ep": 8}, {"ep": 16}])
    a2a = predict(cols, sweep).parts["ep_comm"] / cols["grad_accum"]  # per micro-batch
    # within a node 7/8 of the tokens move over NVLink; across, 8/16 leave through the 50 GB/s NIC
    nvlink, nic = 450 * ALLTOALL_NVLINK_SHARE, 50 * ALLTOALL_NIC_SHARE
    expected = (8 / 16 / nic) / (7 / 8 / nvlink)
    lat = 48 * 4 * 15e-6 * EXPERT_IMBALANCE  # blocks x all-to-alls x NCCL latency
    assert (a2a[1] - lat) / (a2a[0] - lat) == pytest.approx(expected, rel=1e-9)
    assert a2a[1] > 5 * a2a[0]


def test_an_nvl72_rack_keeps_the_all_to_all_on_nvlink():
    gb200 = lookup_gpu("gb200")
    assert gb200 is not None and gb200.nvlink_domain == 72
    rack = moe_sweep(nodes=4, gpu="gb200", per_node=4)  # 16 GPUs on four 4-GPU trays of one rack
    cols = cols_of(rack, [{"ep": 4}, {"ep": 16}])
    a2a = predict(cols, rack).parts["ep_comm"] / cols["grad_accum"]
    lat = 48 * 4 * 15e-6 * EXPERT_IMBALANCE
    assert (a2a[1] - lat) / (a2a[0] - lat) == pytest.approx((15 / 16) / (3 / 4), rel=1e-9)


def test_grouped_expert_gemms_run_at_their_own_size():
    sweep = moe_sweep(nodes=1)
    cols = cols_of(sweep, [{"ep": 8, "micro_batch_size": 4}, {"ep": 1, "micro_batch_size": 1}])
    # 4 x 4096 tokens, top-8 of 128 experts, gathered from 8 ranks: 8192 rows per expert
    assert list(expert_rows(cols, sweep)) == [8192.0, 256.0]
    pred = predict(cols, sweep)
    m = sweep.model
    assert routed_flops_per_token(m) == 6.0 * 48 * 8 * 3 * 2048 * 768
    # seconds per routed FLOP: 256-row GEMMs run far below 8192-row ones; ep > 1 pays the busiest rank
    per_flop = pred.parts["expert_matmul"] / (routed_flops_per_token(m) * 512 * 4096 / 8)
    assert per_flop[1] > 2 * per_flop[0] / EXPERT_IMBALANCE


def test_gradients_reduce_dense_over_dp_cp_and_experts_over_edp():
    dense = dense_sweep()
    cols = cols_of(dense, [{"cp": 1}, {"cp": 2}])
    (params, ranks, stride), *rest = reduction_groups(cols, dense)
    assert not rest and list(ranks) == [8, 8] and list(stride) == [1, 1]
    p = predict(cols, dense).parts
    # the cp ranks hold the same weights: the same reduction as cp = 1 at the same world
    assert (p["dp_comm"] + p["dp_hidden"])[1] == pytest.approx((p["dp_comm"] + p["dp_hidden"])[0])

    sweep = moe_sweep(nodes=2)
    cols = cols_of(sweep, [{"ep": 8, "tp": 2, "etp": 1, "sequence_parallel": True}])
    (dense_params, dp_cp, dense_stride), (experts, edp, expert_stride) = reduction_groups(cols, sweep)
    m = sweep.model
    assert dp_cp[0] == 8 and dense_stride[0] == 2 and edp[0] == 2 and expert_stride[0] == 8
    assert experts[0] == 48 * (128 / 8) * 3 * 2048 * 768
    per_block = m.attention_params / 2 + m.layer_norm_params + m.router_params
    outside = m.vocab * m.hidden / 2 * 2 + m.norm_params  # embedding and head, vocab-parallel
    assert dense_params[0] == pytest.approx(48 * per_block + outside)


def test_a_moe_blocks_mlp_runs_no_tensor_parallel_collective():
    shape = {"layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4, "head_dim": 128, "ffn": 6144, "vocab": 151936}
    moe = shape | {"experts": 128, "experts_per_token": 8, "moe_ffn": 768}
    lay = [{"tp": 2, "etp": 1, "sequence_parallel": True}, {"tp": 2, "etp": 2, "sequence_parallel": True}]
    tp_comm = {}
    for name, model in (("dense", shape), ("moe", moe)):
        sweep = make_sweep(
            model=model,
            seq_len=4096,
            global_batch_size=64,
            cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "h100-sxm"},
            space={"tp": [2]},
            workload=MEGATRON,
        )
        parts = predict(cols_of(sweep, lay), sweep).parts
        tp_comm[name] = parts["tp_comm"]
        if name == "moe":
            # expert tp gathers the tokens an expert receives: dispatch traffic even at ep = 1
            assert parts["ep_comm"][0] == 0.0 < parts["ep_comm"][1]
    # attention's half of the block's collectives is left in every block of this all-MoE model
    assert np.allclose(tp_comm["moe"], tp_comm["dense"] / 2, rtol=1e-12)
