"""Analytic step time and MFU of a layout on the sweep's cluster, vectorised over layouts.

Not a simulator: a ranking model, written once. `predict` returns the step's parts by name
(PARTS): matmuls at the GPU's large-GEMM share of peak that shrinks with the GEMM size,
attention (flash-like at a measured share, or with s x s traffic), memory-bound elementwise
work, fixed costs per block and per micro-batch, recomputation, the pipeline bubble
`(pp-1)/(v*m)` of the work, the optimizer step, and exposed communication: tensor-parallel
collectives, pipeline sends and the data-parallel reduction at NCCL bus bandwidths
(sweeper.estimate.comm) less what hides behind backward; with context or expert parallelism, the cp
group's K/V exchange, the routed experts' grouped GEMMs and their all-to-alls (sweeper.estimate.moe).
`breakdown` and the report read those parts;
how a trainer departs from Megatron-LM's behaviour is a `TimeTraits` value passed in. Two scale
factors, compute and communication, are fitted to measured step times as trials finish.
Measured against public step times by benchmarks/throughput_accuracy.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.comm import allreduce_s, bus_gbps, gather_s
from sweeper.estimate.flops import model_flops_per_token, recompute_flops_per_token
from sweeper.estimate.memory import SCORE_KERNELS, compute_bytes, estimate
from sweeper.estimate.moe import (
    CP_RING_HIDDEN,
    cp_exchange,
    ep_alltoall,
    expert_gemm_size,
    expert_imbalance,
    mlp_elementwise_width,
    moe_block_overhead_s,
    moe_permute_bytes,
    reduction_groups,
    routed_flops_per_token,
    tp_block_share,
)
from sweeper.layouts.layout import Columns
from sweeper.layouts.stages import pipeline_shapes, stage_layers
from sweeper.spec.traits import TimeTraits

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

GIGA = 1e9
GEMM_HALF_SIZE = 0.5  # M*N (in 2^20 elements) at which a GEMM reaches half its large-size efficiency
# attention kernels against FlashAttention-2's share of the GPU (FlashAttention-2 reports ~2x
# FlashAttention-1 and ~1.3-1.5x xformers' memory-efficient kernel, arXiv:2307.08691 fig. 4)
FLASH2_RELATIVE = {"flash1": 0.5, "flash2": 1.0, "sdpa_efficient": 0.7}
SCORE_BYTES = {"eager": 30.0, "sdpa_math": 30.0, "fused_softmax": 12.0}  # HBM bytes per score, fwd + bwd
NORM_PASSES = {"eager": 16.0, "fused": 6.0}  # HBM passes over h per norm, fwd + bwd
COMPILE_ELEMENTWISE = 0.5  # share of elementwise traffic left after torch.compile's fusion
FLOAT8_SPEEDUP = 1.6  # float8 matmuls net of the casts (torchao's float8 README: 1.2-1.6x end to end)
LAYER_OVERHEAD_S = 30e-6  # launch and framework cost per block per micro-batch (fwd + bwd)
OPTIMIZER_BYTES = 28.0  # fused AdamW per parameter: read fp32 param, grad, m, v; write param, m, v (+bf16 copy)
FSDP_OVERLAP = 0.85  # share of FSDP's gathers and reductions hidden by prefetching


@dataclass(frozen=True)
class Calibration:
    """Multipliers fitted to measurements: step = compute_scale*compute + comm_scale*comm."""

    compute_scale: float = 1.0
    comm_scale: float = 1.0
    trials: int = 0


# The parts of a step, in seconds (uncalibrated). COMPUTE_PARTS scale with compute_scale,
# COMM_PARTS with comm_scale; HIDDEN_PARTS are overlapped (not on the step's path, not in total).
COMPUTE_PARTS = (
    "matmul",
    "expert_matmul",
    "attention",
    "memory_bound",
    "framework",
    "recompute",
    "bubble",
    "optimizer",
)
COMM_PARTS = ("tp_comm", "cp_comm", "ep_comm", "pp_comm", "dp_comm")
HIDDEN_PARTS = ("dp_hidden", "cp_hidden")
PARTS = COMPUTE_PARTS + COMM_PARTS + HIDDEN_PARTS
PART_LABELS = {
    "matmul": "matmul compute",
    "expert_matmul": "expert matmuls (grouped)",
    "attention": "attention",
    "memory_bound": "memory-bound (norms, elementwise)",
    "framework": "launch / framework",
    "recompute": "recomputation",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
    "tp_comm": "tensor-parallel comm",
    "cp_comm": "context-parallel K/V exchange (exposed)",
    "ep_comm": "expert dispatch (all-to-all, expert-tp gathers)",
    "pp_comm": "pipeline comm",
    "dp_comm": "data-parallel comm (exposed)",
    "dp_hidden": "data-parallel comm (hidden)",
    "cp_hidden": "context-parallel K/V exchange (hidden)",
}


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step by part (arrays over layouts) and the predicted MFU.

    `parts` holds every part of PARTS, uncalibrated; `compute` and `comm` are their sums
    over COMPUTE_PARTS and COMM_PARTS, and `total` applies the calibration.
    """

    compute: np.ndarray
    comm: np.ndarray
    calibration: Calibration
    mfu: np.ndarray
    parts: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def total(self) -> np.ndarray:
        return self.calibration.compute_scale * self.compute + self.calibration.comm_scale * self.comm

    def calibrated_parts(self) -> dict[str, np.ndarray]:
        """Every part with its scale applied: the exposed ones add up to `total`."""
        c = self.calibration
        return {k: v * (c.compute_scale if k in COMPUTE_PARTS else c.comm_scale) for k, v in self.parts.items()}


def gemm_efficiency(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Share of peak a block's matmuls reach: the GPU's large-GEMM share, lower for small GEMMs.

    The size is tokens x width per rank (micro-batch x sequence / cp x hidden / tp), which Anthony
    et al. 2024 (arXiv:2401.14489, sec. 4) show sets the efficiency well below a few million elements.
    """
    gemm = cols["micro_batch_size"] * sweep.seq_len / cols["cp"] * (sweep.model.hidden / cols["tp"]) / 2**20
    return gemm_efficiency_at(gemm, cols, sweep)


def gemm_efficiency_at(gemm: np.ndarray, cols: Columns, sweep: Sweep) -> np.ndarray:
    """`gemm_efficiency` of GEMMs of `gemm` x 2^20 output elements (an expert's grouped GEMM too)."""
    gpu = sweep.cluster.gpu
    eff = gpu.gemm_share * gemm / (gemm + GEMM_HALF_SIZE)
    eff = eff * np.where(cols["compile"].astype(bool), 1.03, 1.0)
    return eff * np.where(cols["float8"].astype(bool) & gpu.supports_fp8, FLOAT8_SPEEDUP, 1.0)


def predict_table(cols: Columns, sweep: Sweep, calibration: Calibration, traits: TimeTraits) -> StepTime:
    """`predict` from the GPU table's figures and the trainer's traits."""
    m, gpu, cl = sweep.model, sweep.cluster.gpu, sweep.cluster
    s, L, h, a = sweep.seq_len, m.layers, m.hidden, m.heads
    e = compute_bytes(sweep)
    tp, pp, dp = (cols[k].astype(float) for k in ("tp", "pp", "dp"))
    mbs, accum = cols["micro_batch_size"].astype(float), np.maximum(cols["grad_accum"], 1).astype(float)
    peak = gpu.peak_flops(sweep.trial.precision)
    tokens_gpu = sweep.global_batch_size * s / cl.world  # tokens per step, per GPU share of the model
    mode = cols["activation_checkpointing"]
    full = mode == "full"

    # uneven stages: the pipeline runs at the pace of its most loaded rank
    busiest = busiest_stage_layers(cols, L)
    imbalance = busiest * pp / L

    # --- matmuls with the weights: fwd 2N, bwd 4N (flops.py); recomputed forwards apart ---
    eff = gemm_efficiency(cols, sweep)
    per_flop = tokens_gpu * imbalance / (peak * eff)
    q = m.q_dim
    routed = routed_flops_per_token(m)  # the routed experts: grouped GEMMs at their own size
    matmul = (model_flops_per_token(m, s) - 12.0 * L * q * s - routed) * per_flop
    expert_per_flop = np.zeros(len(tp))
    if routed:
        expert_eff = gemm_efficiency_at(expert_gemm_size(cols, sweep), cols, sweep)
        expert_per_flop = tokens_gpu * imbalance * expert_imbalance(cols) / (peak * expert_eff)
    expert_matmul = routed * expert_per_flop
    re_flops = np.select(
        [full, mode == "ffn"], [recompute_flops_per_token(m, s, "full"), recompute_flops_per_token(m, s, "ffn")], 0.0
    )
    re_routed = np.where(full | (mode == "ffn"), routed / 3.0, 0.0)  # the routed experts' forward again

    # --- attention: flash-like at a share of peak; score kernels add s x s HBM traffic -------
    kernel = cols["attention"]
    scores = np.isin(kernel, SCORE_KERNELS)
    share = np.select(
        [kernel == "cudnn", *(kernel == k for k in FLASH2_RELATIVE)],
        [gpu.fused_attention_share, *(gpu.flash2_share * v for v in FLASH2_RELATIVE.values())],
        gpu.flash2_share,
    )
    attn_eff = np.where(scores, eff, share)
    attn_per_flop = tokens_gpu * imbalance / (peak * attn_eff)
    score_bytes = np.select([kernel == k for k in SCORE_KERNELS], [SCORE_BYTES[k] for k in SCORE_KERNELS], 0.0)
    attention = 12.0 * L * q * s * attn_per_flop + L * a * s * score_bytes * tokens_gpu * imbalance / (
        gpu.hbm_gbps * GIGA
    )
    re_attention = np.where(full, 4.0 * L * q * s, 0.0) * attn_per_flop
    recompute_matmul = (re_flops - np.where(full, 4.0 * L * q * s, 0.0) - re_routed) * per_flop
    recompute_matmul = recompute_matmul + re_routed * expert_per_flop

    # --- elementwise: norms (replicated over tp without sequence parallel), RoPE, SwiGLU ----
    sp = cols["effective_sp"]
    norm_passes = np.where(cols["rmsnorm"] == "fused", NORM_PASSES["fused"], NORM_PASSES["eager"])
    norm_bytes = 2 * norm_passes * h * e * np.where(sp, 1.0, tp)  # per token per layer, this GPU's share x tp
    other_bytes = (12 * (h + 2 * m.kv_dim) + 18 * mlp_elementwise_width(m) + 12 * h) * e + moe_permute_bytes(m, e)
    memory_bound = L * (norm_bytes + other_bytes) * tokens_gpu * imbalance / (gpu.hbm_gbps * GIGA)
    memory_bound = memory_bound * np.where(cols["compile"].astype(bool), COMPILE_ELEMENTWISE, 1.0)
    # the loss on the last stage: each of its GPUs holds the vocab/tp logits of tokens_gpu * tp * pp tokens
    loss_logits = tokens_gpu * pp * m.vocab
    memory_bound = memory_bound + traits.loss_traffic_per_logit * loss_logits / (gpu.hbm_gbps * GIGA)

    per_mb_layers = busiest * accum  # block passes the busiest GPU runs per step
    moe_overhead = moe_block_overhead_s(m, per_mb_layers)  # a MoE block's host-side cost (estimate.moe)
    framework = LAYER_OVERHEAD_S * per_mb_layers + traits.microbatch_s * accum + moe_overhead
    re_framework = np.where(full, 0.5 * LAYER_OVERHEAD_S * per_mb_layers, 0.0)
    re_framework = re_framework + np.where(full | (mode == "ffn"), 0.5 * moe_overhead, 0.0)
    recompute = recompute_matmul + re_attention + re_framework
    if traits.memory_pressure > 0:  # counted as framework time: the allocator's, not the model's
        share = estimate(cols, sweep).total / (gpu.memory_gib * 2**30)
        slow = traits.memory_pressure * np.clip((share - 0.9) / 0.1, 0.0, 1.0)
        framework = framework + slow * (matmul + expert_matmul + attention + memory_bound + framework + recompute)
    work = matmul + expert_matmul + attention + memory_bound + framework + recompute

    # --- pipeline bubble: (pp-1)/(v*m) of the work (Megatron-LM, Narayanan et al. 2021, sec. 2.2);
    # with fewer micro-batches than stages the same formula prices the longer fill and drain
    chunks = cols["chunks"].astype(float)
    bubble_share = np.where(pp > 1, (pp - 1) / chunks / accum, 0.0)
    bubble = work * bubble_share
    # a trainer's random pipeline stall (PipelineStall): m x the stall whatever pp (a stalled run's
    # step in the ultrascale sweep), so outside the bubble; counted as framework time
    if traits.pp_stall is not None:
        framework = framework + np.where(pp > 1, traits.pp_stall.cost_s(cl.nodes) * accum, 0.0)

    # --- tensor parallel: with SP 2 all-gathers + 2 reduce-scatters per block forward and as
    # many backward (the volume of 4 all-reduces); without SP 4 all-reduces (6 with full recompute)
    intra = np.full(len(tp), gpu.intra_gbps)
    cp = cols["cp"].astype(float)
    act_bytes = mbs * s / cp * h * e  # a rank's seq/cp tokens
    n_coll = np.where(sp, 8.0, 4.0) * np.where(full, 1.5, 1.0)
    latency = (
        traits.tp_collective_s
        if traits.tp_collective_pp_s is None
        else np.where(pp > 1, traits.tp_collective_pp_s, traits.tp_collective_s)
    )
    tp_per_block = np.where(
        tp > 1,
        4.0 * np.where(full, 1.5, 1.0) * 2 * (tp - 1) / tp * act_bytes / (intra * GIGA) + n_coll * latency,
        0.0,
    )
    tp_comm = tp_per_block * per_mb_layers * (1 + bubble_share) * tp_block_share(m)

    # --- context parallel's K/V exchange (a ring hides behind the attention of the remote chunks)
    # and the experts' token all-to-alls (sweeper.estimate.moe) ------------------------------------
    moves = per_mb_layers * (3.0 + full) * (1 + bubble_share)
    cp_raw, cp_hideable = cp_exchange(cols, sweep, e, moves, ring=traits.cp_ring)
    remote = (attention + re_attention) * (cp - 1) / cp * (1 + bubble_share)
    cp_comm = cp_raw - np.minimum(cp_hideable, CP_RING_HIDDEN * remote)
    ep_comm = ep_alltoall(cols, sweep, e, per_mb_layers * (2.0 + full) * (1 + bubble_share))

    # --- pipeline sends: activations forward, gradients back, per micro-batch per boundary ---
    ranks_per_stage = tp * cp * dp
    pp_gbps = np.where(ranks_per_stage >= cl.gpus_per_node, gpu.inter_gbps, gpu.intra_gbps)
    sends = 2 * accum * chunks + 2 * (pp - 1) * chunks  # the steady state plus fill and drain
    pp_bytes = act_bytes / np.where(sp, tp, 1.0)
    pp_comm = np.where(pp > 1, sends * (pp_bytes / (pp_gbps * GIGA) + traits.p2p_latency_s), 0.0)

    # --- data parallel: fp32 gradient all-reduce (DDP), reduce-scatter + bf16 all-gather
    # (ZeRO-1 / distributed optimizer), or FSDP's per-use gathers and reductions -------------
    # dense parameters over dp*cp, a mixture's routed experts over expert data parallel (estimate.moe)
    groups = reduction_groups(cols, sweep)
    sharding = cols["sharding"]
    zero1 = sharding == "zero1"
    fsdp = sharding == "fsdp"
    reduce_raw = np.zeros(len(tp))
    for group_params, ranks, stride in groups:
        ar_bw = bus_gbps(gpu, cl.gpus_per_node, ranks, stride, gather=False)
        ag_bw = bus_gbps(gpu, cl.gpus_per_node, ranks, stride, gather=True)
        reduce_raw = reduce_raw + np.where(
            zero1,
            gather_s(group_params * 4.0, ranks, ag_bw) + gather_s(group_params * e, ranks, ag_bw),
            allreduce_s(group_params * 4.0, ranks, ar_bw),
        )
    params = sum(g[0] for g in groups)
    replicas = dp * cp  # what FSDP shards over
    ag_bw = bus_gbps(gpu, cl.gpus_per_node, replicas, tp, gather=True)
    per_mb_sync = (sharding == "none") & (pp > 1) & traits.grad_sync_per_microbatch_pp
    reduce_raw = np.where(per_mb_sync, reduce_raw * accum, reduce_raw)
    last_backward = (2.0 / 3.0) * work / accum
    fsdp_volume = np.where(pp > 1, 1.0, accum) * (2 * params * e) + params * 4.0  # gathers (+per micro-batch) + RS
    fsdp_raw = np.where(replicas > 1, (replicas - 1) / np.maximum(replicas, 1) * fsdp_volume / (ag_bw * GIGA), 0.0)
    dp_raw = np.where(fsdp, fsdp_raw, reduce_raw)
    dp_comm = np.where(
        fsdp,
        np.maximum(fsdp_raw - FSDP_OVERLAP * work, 0.1 * fsdp_raw),
        np.maximum(reduce_raw - traits.dp_overlap * np.where(per_mb_sync, 0.0, last_backward), 0.0),
    )

    # --- optimizer: fused AdamW streams its states once per step (sharded by ZeRO-1 and FSDP) --
    opt_params = sum(p / np.where(sharding == "none", 1.0, np.maximum(n, 1)) for p, n, _ in groups)
    optimizer = opt_params * OPTIMIZER_BYTES / (gpu.hbm_gbps * GIGA)

    parts = {
        "matmul": matmul,
        "expert_matmul": expert_matmul,
        "attention": attention,
        "memory_bound": memory_bound,
        "framework": framework,
        "recompute": recompute,
        "bubble": bubble,
        "optimizer": optimizer,
        "tp_comm": tp_comm,
        "cp_comm": cp_comm,
        "ep_comm": ep_comm,
        "pp_comm": pp_comm,
        "dp_comm": dp_comm,
        "dp_hidden": np.maximum(dp_raw - dp_comm, 0.0),
        "cp_hidden": cp_raw - cp_comm,
    }
    compute = sum(parts[k] for k in COMPUTE_PARTS)
    comm = sum(parts[k] for k in COMM_PARTS)
    step = calibration.compute_scale * compute + calibration.comm_scale * comm
    mfu = model_flops_per_token(m, s) * sweep.global_batch_size * s / (step * cl.world * peak)
    return StepTime(np.asarray(compute), np.asarray(comm), calibration, mfu, parts)


def busiest_stage_layers(cols: Columns, layers: int) -> np.ndarray:
    """Layers on the most loaded pipeline rank of each layout (`memory.stage_layers`)."""
    out = np.zeros(len(cols["pp"]))
    for pp_value, chunks in pipeline_shapes(cols):
        rows = (cols["pp"] == pp_value) & (cols["chunks"] == chunks)
        out[rows] = max(stage_layers(layers, pp_value, chunks)) if pp_value <= layers else np.nan
    return out


def calibrate(pred: StepTime, rows: Sequence[int], measured_step_s: Sequence[float]) -> Calibration:
    """Fit the two scales to measured step times of finished trials (least squares, clipped).

    One measurement moves both scales together; from two on, compute and communication
    are fitted separately, each kept within [0.2, 5] of the model's own estimate.
    """
    if not rows:
        return Calibration()
    idx = np.asarray(rows, dtype=int)
    y = np.asarray(measured_step_s, dtype=float)
    x = np.stack([pred.compute[idx], pred.comm[idx]], axis=1)
    if len(idx) == 1 or np.allclose(x[:, 1], 0):
        k = float(np.median(y / np.maximum(x.sum(axis=1), 1e-12)))
        k = float(np.clip(k, 0.2, 5.0))
        return Calibration(k, k, len(idx))
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    c, k = (float(np.clip(v, 0.2, 5.0)) for v in coef)
    return Calibration(c, k, len(idx))


# ---- the step explained (for `sweep report`) -----------------------------------------------
MISS_SHARE = 0.15  # beyond this relative miss of a measured step, the parts do not explain it


def model_misses(predicted_s: np.ndarray, measured_s: np.ndarray, share: float = MISS_SHARE) -> np.ndarray:
    """Signed relative miss (predicted / measured - 1) of each trial where it exceeds `share`, else NaN.

    A report attributes a step-time gap to a modelled part only where the (calibrated) model
    reproduces the measured step time; where it misses, the gap is the measurement's, unexplained.
    """
    miss = np.asarray(predicted_s, dtype=float) / np.asarray(measured_s, dtype=float) - 1.0
    return np.where(np.abs(miss) > share, miss, np.nan)
