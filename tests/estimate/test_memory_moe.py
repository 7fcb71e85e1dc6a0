"""Memory of mixture-of-experts and context-parallel layouts, against figures from their sources:
the published parameter counts, Megatron-LM's distributed optimizer and CI peaks, Transformer
Engine's ring buffers, and NVIDIA's published layouts (which ran, so fit)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import yaml

from sweeper.estimate.memory import estimate, layer_activation_bytes
from sweeper.layouts.layout import Layout
from sweeper.layouts.stages import stage_dense_layers, stage_param_groups_at
from sweeper.plan.plan import make_plan
from sweeper.spec.hardware import GIB
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep

MEGATRON = {"kind": "megatron", "command": "torchrun pretrain_gpt.py {flags}"}


def sweep_of(model: Any, gpus: int, space: dict[str, Any], *, seq: int = 4096, gbs: int = 1024, **extra: Any) -> Sweep:
    per_node = min(gpus, 8)
    spec = {
        "name": "moe_memory",
        "model": model,
        "seq_len": seq,
        "global_batch_size": gbs,
        "cluster": {"nodes": gpus // per_node, "gpus_per_node": per_node, "gpu": "h100-sxm"},
        "space": {k: v if isinstance(v, list) else [v] for k, v in space.items()},
        "memory": {"recipe": "megatron"},
        "workload": MEGATRON,
    } | extra
    return parse_sweep(yaml.safe_dump(spec))


def cols_of(sweep: Sweep, **knobs: Any) -> dict[str, np.ndarray]:
    return Layout(**knobs).columns(sweep)


def test_mixtral_rank_with_ep8_holds_one_expert_of_each_block():
    # Mistral's figures (46.7 B total, 12.9 B per token with top-2 of 8 experts): six unused
    # experts make the difference, so one expert in every block is (46.7 - 12.9)/6 B and a rank
    # of ep = 8 holds the total less seven of them; each published figure is rounded to 0.05 B
    one_expert = (46.7e9 - 12.9e9) / 6
    published = 46.7e9 - 7 * one_expert
    s = sweep_of("mixtral-8x7b", 8, {"tp": 1, "ep": 8, "micro_batch_size": 1})
    shared, experts = stage_param_groups_at(cols_of(s, ep=8), s, 32.0, first=True, last=True)
    assert abs(float(shared[0] + experts[0]) - published) < 0.2e9
    assert abs(float(experts[0]) - one_expert) < 0.02e9


def test_expert_states_shard_over_expert_data_parallel():
    # Megatron-LM's distributed optimizer: 6 + 12/d bytes per parameter (bf16 weight, fp32 grad;
    # fp32 master and Adam moments sharded over d, docs/source/api-guide/dist_optimizer.md), with
    # d = dp*cp for the dense parameters and d = edp = world/(etp*ep*pp) for the experts
    s = sweep_of("mixtral-8x7b", 64, {"tp": 1, "ep": 8, "sharding": "zero1", "micro_batch_size": 1})
    c = cols_of(s, ep=8, sharding="zero1")
    assert (int(c["dp"][0]), int(c["edp"][0])) == (64, 8)
    shared, experts = (float(x[0]) for x in stage_param_groups_at(c, s, 32.0, first=True, last=True))
    e = estimate(c, s)
    states = float(e.weights[0] + e.grads[0] + e.optimizer[0])
    assert states == pytest.approx(6 * (shared + experts) + 12 * shared / 64 + 12 * experts / 8, rel=1e-9)


def test_context_parallel_also_shards_the_dense_optimizer_states():
    # "CP ... Optimizer states 1/N (with distributed optimizer)" (Megatron-LM moe/README.md, the
    # parallelism table): the shard group of the dense parameters is dp*cp
    s = sweep_of("llama3-8b", 8, {"tp": 1, "cp": [1, 2], "sharding": "zero1"}, seq=8192, gbs=64)
    one, two = (estimate(cols_of(s, cp=cp, sharding="zero1"), s).optimizer[0] for cp in (1, 2))
    assert two == pytest.approx(one)  # dp 8 at cp 1, dp 4 x cp 2 at cp 2: the same 8 shards


def test_the_dense_leading_blocks_sit_on_the_first_stage():
    # Megatron-LM's --moe-layer-freq ([0]*3+[1]*58) for DeepSeek-V3's 61 blocks on 8 stages
    assert stage_dense_layers(61, 3, 8) == (3, 0, 0, 0, 0, 0, 0, 0)
    assert stage_dense_layers(8, 3, 2, 2) == (2, 1)  # interleaved: chunks 0 and 1 on ranks 0 and 1


def test_megatron_cp_halves_the_activations_and_adds_transformer_engines_ring_buffers():
    # moe/README.md: "CP: peak activation memory 1/N"; TE's AttnFuncWithCPAndKVP2P.backward
    # allocates two buffers of [K/V, dK/dV] of the local chunk: 4 x (4096 tokens x 2 x kv_dim 1024
    # x 2 bytes) = 64 MiB at cp = 2 for Llama 3 8B at seq 8192
    s = sweep_of("llama3-8b", 8, {"tp": 1, "cp": [1, 2], "attention": "cudnn"}, seq=8192, gbs=64)
    kept1, transient1 = layer_activation_bytes(cols_of(s, cp=1, attention="cudnn"), s)
    kept2, transient2 = layer_activation_bytes(cols_of(s, cp=2, attention="cudnn"), s)
    assert kept2[0] == pytest.approx(kept1[0] / 2)
    assert (transient1[0], transient2[0]) == (0.0, 4 * 4096 * 2 * 1024 * 2)


def test_builtin_cp_keeps_the_whole_sequences_keys_and_values():
    # sweeper/runtime/context.py: "The all-gather holds the whole sequence's K/V per rank"; at
    # cp = 2 a block keeps the other rank's 4096 tokens of K and V beside its own: 16 MiB more
    s = sweep_of(
        "llama3-8b",
        8,
        {"tp": 1, "cp": [1, 2]},
        seq=8192,
        gbs=64,
        workload={"kind": "builtin"},
        memory={"recipe": "builtin"},
    )
    kept1, _ = layer_activation_bytes(cols_of(s, cp=1), s)
    kept2, transient2 = layer_activation_bytes(cols_of(s, cp=2), s)
    assert kept2[0] - kept1[0] / 2 == pytest.approx(4096 * 2 * 1024 * 2)
    assert transient2[0] == 8192 * 2 * 1024 * 2  # the whole sequence's dK, dV before the reduce-scatter


# Megatron-LM CI (NVIDIA/Megatron-LM@d98e8a64, tests/functional_tests/test_cases/, golden values
# on dgx_h100, mem-max-allocated-bytes on the last pipeline rank; 8 GPUs): the 12 x 512 test GPT
# (GELU, LayerNorm, learned positions, tied, GPT-2 vocab padded to 128*tp) with micro batch 4, seq 1024
CI_MODEL = {"layers": 12, "hidden": 512, "heads": 8, "ffn": 2048, "mlp": "gelu", "norm": "layernorm"}
CI_CASES = {
    # moe/gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4: 4013319680 bytes
    "ep4_etp1": (
        4013319680,
        {"experts": 8, "experts_per_token": 2, "vocab": 50432},
        {"tp": 2, "pp": 1, "ep": 4, "etp": 1, "attention": "eager"},
    ),
    # moe/gpt3_mcore_tp2_cp2_pp2_ep2_te_4experts2parallel: 1114966528 bytes
    "cp2_ep2": (
        1114966528,
        {"experts": 4, "experts_per_token": 1, "vocab": 50432},
        {"tp": 2, "pp": 2, "cp": 2, "ep": 2, "attention": "flash2"},
    ),
    # gpt/gpt3_mcore_te_tp2_pp2_cp2: 935253504 bytes
    "dense_cp2": (935253504, {"vocab": 50432}, {"tp": 2, "pp": 2, "cp": 2, "attention": "flash2"}),
}


@pytest.mark.parametrize("case", sorted(CI_CASES))
def test_megatron_ci_moe_and_cp_peaks(case):
    measured, shape, knobs = CI_CASES[case]
    model = CI_MODEL | {"position": "learned", "tied_embeddings": True} | shape
    knobs = knobs | {"micro_batch_size": 4, "sequence_parallel": True, "rmsnorm": "fused"}
    s = sweep_of(model, 8, knobs, seq=1024, gbs=32)
    c = cols_of(s, **knobs)
    assert Layout(**knobs).rejection(s) is None
    allocated = float(estimate(c, s, rank=-1).allocated[0])
    assert allocated == pytest.approx(measured, rel=0.12)


def test_the_expert_group_folds_over_tensor_parallel_ranks_where_etp_is_one():
    # NVIDIA's Qwen3-235B-A22B on 256 H100 (Megatron-Bridge 26.04.01: tp 2, pp 8, ep 32, dp 16):
    # Megatron-LM only needs etp*ep*pp to divide the world (parallel_state.py), so ep 32 spans
    # dp 16 x tp 2 with etp 1; with etp = tp = 2 it cannot
    s = sweep_of("qwen3-235b-a22b", 256, {"tp": 2, "pp": 8, "ep": 32, "etp": [1, 2], "sequence_parallel": True})
    knobs = {"tp": 2, "pp": 8, "ep": 32, "sequence_parallel": True}
    assert Layout(**knobs, etp=1).rejection(s) is None
    why = Layout(**knobs, etp=2).rejection(s)
    assert why is not None and "ep*etp = 32*2 does not divide dp*cp*tp = 16*1*2" in why.message


# NVIDIA's published layouts (../shared/data/nvidia-perf, Megatron-Bridge performance summary):
# they ran, so the plan must keep them under some activation checkpointing a sweep searches
PUBLISHED = {
    # 26.04.01 DGX-H100: Qwen3-235B-A22B, 256 GPUs, tp2 pp8 vp4 ep32, mbs 1, gbs 8192
    "qwen3-235b-a22b": (256, 8192, {"tp": 2, "pp": 8, "virtual_stages": 4, "ep": 32, "etp": 1}),
    # 26.02 DGX-H100: Qwen3-30B-A3B, 16 GPUs, tp1 pp2 vp12 ep8, mbs 1, gbs 1024
    "qwen3-30b-a3b": (16, 1024, {"tp": 1, "pp": 2, "virtual_stages": 12, "ep": 8}),
    # 26.04 DGX-H100: GPT-OSS-120B, 64 GPUs, tp1 pp4 ep8, mbs 1, gbs 1280
    "gpt-oss-120b": (64, 1280, {"tp": 1, "pp": 4, "ep": 8}),
}


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_nvidias_published_moe_layouts_are_kept(model):
    gpus, gbs, knobs = PUBLISHED[model]
    space = knobs | {
        "micro_batch_size": 1,
        "sequence_parallel": knobs["tp"] > 1,
        "attention": "cudnn",
        "rmsnorm": "fused",
        "sharding": "zero1",
        "pp_schedule": "interleaved" if knobs.get("virtual_stages", 1) > 1 else "1f1b",
        "activation_checkpointing": ["none", "selective", "ffn", "full"],
    }
    plan = make_plan(sweep_of(model, gpus, space, gbs=gbs))
    assert plan.candidate_mask.any(), list(zip(plan.status, plan.reason, plan.memory.total / GIB, strict=True))


def test_the_built_in_trainer_keeps_its_expert_groups_inside_dp_cp():
    # the built-in trainer (sweeper/runtime/moe.py, expert_tp "one") splits experts over the data-
    # and context-parallel ranks only; Megatron-LM folds them over tp as well when etp = 1
    model = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256, "experts": 8, "experts_per_token": 2}
    knobs = {"tp": 2, "ep": 8, "etp": 1, "sequence_parallel": True}
    builtin = sweep_of(model, 8, knobs, seq=64, gbs=8, workload={"kind": "builtin"}, memory={"recipe": "builtin"})
    why = Layout(**knobs).rejection(builtin)
    assert why is not None and "ep = 8 does not divide dp*cp = 4*1" in why.message
    assert Layout(**knobs).rejection(sweep_of(model, 8, knobs, seq=64, gbs=8)) is None
