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

ReductionGroups = list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (params per rank, ranks, stride)
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


@dataclass(frozen=True)
class _Basis:
    """What every part of the step reads: the layouts' columns and the figures derived once from them."""

    cols: Columns
    sweep: Sweep
    traits: TimeTraits
    e: float  # bytes per activation element
    peak: float  # FLOP/s of one GPU at the trial's precision
    tokens_gpu: float  # tokens per step per GPU's share of the model
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    accum: np.ndarray
    chunks: np.ndarray
    full: np.ndarray  # full activation checkpointing
    ffn: np.ndarray  # the MLPs recomputed
    busiest: np.ndarray  # layers on the most loaded pipeline rank
    imbalance: np.ndarray  # busiest / mean layers per rank: the pipeline runs at its pace
    per_mb_layers: np.ndarray  # block passes the busiest GPU runs per step
    per_flop: np.ndarray  # seconds per matmul FLOP of a token at this layout's GEMM efficiency
    act_bytes: np.ndarray  # one micro-batch's activations of a rank (seq/cp tokens x hidden)


def _basis(cols: Columns, sweep: Sweep, traits: TimeTraits) -> _Basis:
    m, cl = sweep.model, sweep.cluster
    peak = cl.gpu.peak_flops(sweep.trial.precision)
    tokens_gpu = sweep.global_batch_size * sweep.seq_len / cl.world
    tp, pp, dp, cp = (cols[k].astype(float) for k in ("tp", "pp", "dp", "cp"))
    accum = np.maximum(cols["grad_accum"], 1).astype(float)
    busiest = busiest_stage_layers(cols, m.layers)
    imbalance = busiest * pp / m.layers
    e = compute_bytes(sweep)
    mode = cols["activation_checkpointing"]
    return _Basis(
        cols=cols,
        sweep=sweep,
        traits=traits,
        e=e,
        peak=peak,
        tokens_gpu=tokens_gpu,
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        accum=accum,
        chunks=cols["chunks"].astype(float),
        full=mode == "full",
        ffn=mode == "ffn",
        busiest=busiest,
        imbalance=imbalance,
        per_mb_layers=busiest * accum,
        per_flop=tokens_gpu * imbalance / (peak * gemm_efficiency(cols, sweep)),
        act_bytes=cols["micro_batch_size"].astype(float) * sweep.seq_len / cp * m.hidden * e,
    )


def _hbm_s(b: _Basis, bytes_per_token: np.ndarray | float) -> np.ndarray:
    """Seconds to stream `bytes_per_token` for each of the busiest rank's tokens through HBM."""
    return bytes_per_token * b.tokens_gpu * b.imbalance / (b.sweep.cluster.gpu.hbm_gbps * GIGA)


def _matmuls(b: _Basis) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The weights' matmuls (fwd 2N, bwd 4N, flops.py) and the routed experts' grouped GEMMs at their
    own size; with the experts' seconds per FLOP, which their recomputation pays too."""
    m, s = b.sweep.model, b.sweep.seq_len
    routed = routed_flops_per_token(m)
    matmul = (model_flops_per_token(m, s) - 12.0 * m.layers * m.q_dim * s - routed) * b.per_flop
    expert_per_flop = np.zeros(len(b.tp))
    if routed:
        expert_eff = gemm_efficiency_at(expert_gemm_size(b.cols, b.sweep), b.cols, b.sweep)
        expert_per_flop = b.tokens_gpu * b.imbalance * expert_imbalance(b.cols) / (b.peak * expert_eff)
    return matmul, routed * expert_per_flop, expert_per_flop


def _attention(b: _Basis) -> tuple[np.ndarray, np.ndarray]:
    """Attention, flash-like at a share of peak (score kernels add s x s HBM traffic), and its
    recomputation under full checkpointing."""
    m, s, gpu = b.sweep.model, b.sweep.seq_len, b.sweep.cluster.gpu
    kernel = b.cols["attention"]
    scores = np.isin(kernel, SCORE_KERNELS)
    share = np.select(
        [kernel == "cudnn", *(kernel == k for k in FLASH2_RELATIVE)],
        [gpu.fused_attention_share, *(gpu.flash2_share * v for v in FLASH2_RELATIVE.values())],
        gpu.flash2_share,
    )
    attn_eff = np.where(scores, gemm_efficiency(b.cols, b.sweep), share)
    attn_per_flop = b.tokens_gpu * b.imbalance / (b.peak * attn_eff)
    score_bytes = np.select([kernel == k for k in SCORE_KERNELS], [SCORE_BYTES[k] for k in SCORE_KERNELS], 0.0)
    flops = 12.0 * m.layers * m.q_dim * s
    attention = flops * attn_per_flop + _hbm_s(b, m.layers * m.heads * s * score_bytes)
    return attention, np.where(b.full, 4.0 * m.layers * m.q_dim * s, 0.0) * attn_per_flop  # the forward again


def _recompute_matmuls(b: _Basis, expert_per_flop: np.ndarray) -> np.ndarray:
    """The forward matmuls checkpointing runs again (attention apart, `_attention`)."""
    m, s = b.sweep.model, b.sweep.seq_len
    re_flops = np.select(
        [b.full, b.ffn], [recompute_flops_per_token(m, s, "full"), recompute_flops_per_token(m, s, "ffn")], 0.0
    )
    re_routed = np.where(b.full | b.ffn, routed_flops_per_token(m) / 3.0, 0.0)  # the routed experts' forward
    dense = (re_flops - np.where(b.full, 4.0 * m.layers * m.q_dim * s, 0.0) - re_routed) * b.per_flop
    return dense + re_routed * expert_per_flop


def _memory_bound(b: _Basis) -> np.ndarray:
    """Elementwise traffic: norms (replicated over tp without sequence parallel), RoPE, SwiGLU, and
    the loss on the last stage, whose GPUs hold the vocab/tp logits of tokens_gpu * tp * pp tokens."""
    m, e, cols = b.sweep.model, b.e, b.cols
    norm_passes = np.where(cols["rmsnorm"] == "fused", NORM_PASSES["fused"], NORM_PASSES["eager"])
    norm_bytes = 2 * norm_passes * m.hidden * e * np.where(cols["effective_sp"], 1.0, b.tp)
    width = 12 * (m.hidden + 2 * m.kv_dim) + 18 * mlp_elementwise_width(m) + 12 * m.hidden
    other_bytes = width * e + moe_permute_bytes(m, e)  # RoPE, SwiGLU, residuals; a mixture's permutes
    blocks = _hbm_s(b, m.layers * (norm_bytes + other_bytes))
    blocks = blocks * np.where(cols["compile"].astype(bool), COMPILE_ELEMENTWISE, 1.0)
    loss_logits = b.tokens_gpu * b.pp * m.vocab
    return blocks + b.traits.loss_traffic_per_logit * loss_logits / (b.sweep.cluster.gpu.hbm_gbps * GIGA)


def _framework(b: _Basis) -> tuple[np.ndarray, np.ndarray]:
    """Launch and framework cost per block and per micro-batch (a MoE block's host-side cost,
    estimate.moe, included), and what checkpointing's second forward adds to it."""
    moe_overhead = moe_block_overhead_s(b.sweep.model, b.per_mb_layers)
    framework = LAYER_OVERHEAD_S * b.per_mb_layers + b.traits.microbatch_s * b.accum + moe_overhead
    again = np.where(b.full, 0.5 * LAYER_OVERHEAD_S * b.per_mb_layers, 0.0)
    return framework, again + np.where(b.full | b.ffn, 0.5 * moe_overhead, 0.0)


def _memory_pressure(b: _Basis, busy: np.ndarray) -> np.ndarray:
    """The allocator's slowdown of a trainer that runs near a full card (counted as framework time)."""
    if b.traits.memory_pressure <= 0:
        return np.zeros(len(b.tp))
    share = estimate(b.cols, b.sweep).total / (b.sweep.cluster.gpu.memory_gib * 2**30)
    return b.traits.memory_pressure * np.clip((share - 0.9) / 0.1, 0.0, 1.0) * busy


def _bubble_share(b: _Basis) -> np.ndarray:
    """(pp-1)/(v*m) of the work (Megatron-LM, Narayanan et al. 2021, sec. 2.2); with fewer
    micro-batches than stages the same formula prices the longer fill and drain."""
    return np.where(b.pp > 1, (b.pp - 1) / b.chunks / b.accum, 0.0)


def _pp_stall(b: _Basis) -> np.ndarray:
    """A trainer's random pipeline stall (PipelineStall): m x the stall whatever pp (a stalled run's
    step in the ultrascale sweep), so outside the bubble; counted as framework time."""
    stall = b.traits.pp_stall
    if stall is None:
        return np.zeros(len(b.tp))
    return np.where(b.pp > 1, stall.cost_s(b.sweep.cluster.nodes) * b.accum, 0.0)


def _tp_comm(b: _Basis, bubble_share: np.ndarray) -> np.ndarray:
    """Tensor parallel: with SP 2 all-gathers + 2 reduce-scatters per block forward and as many
    backward (the volume of 4 all-reduces); without SP 4 all-reduces (6 with full recompute)."""
    traits, tp = b.traits, b.tp
    intra = b.sweep.cluster.gpu.intra_gbps
    again = np.where(b.full, 1.5, 1.0)
    n_coll = np.where(b.cols["effective_sp"], 8.0, 4.0) * again
    latency = (
        traits.tp_collective_s
        if traits.tp_collective_pp_s is None
        else np.where(b.pp > 1, traits.tp_collective_pp_s, traits.tp_collective_s)
    )
    volume_s = 4.0 * again * 2 * (tp - 1) / tp * b.act_bytes / (intra * GIGA)
    per_block = np.where(tp > 1, volume_s + n_coll * latency, 0.0)
    return per_block * b.per_mb_layers * (1 + bubble_share) * tp_block_share(b.sweep.model)


def _cp_comm(b: _Basis, attention: np.ndarray, bubble_share: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Context parallel's K/V exchange, exposed and raw: a ring hides behind the attention of the
    remote chunks (sweeper.estimate.moe)."""
    moves = b.per_mb_layers * (3.0 + b.full) * (1 + bubble_share)
    raw, hideable = cp_exchange(b.cols, b.sweep, b.e, moves, ring=b.traits.cp_ring)
    remote = attention * (b.cp - 1) / b.cp * (1 + bubble_share)
    return raw - np.minimum(hideable, CP_RING_HIDDEN * remote), raw


def _ep_comm(b: _Basis, bubble_share: np.ndarray) -> np.ndarray:
    """The experts' token all-to-alls and expert-tp gathers (sweeper.estimate.moe)."""
    return ep_alltoall(b.cols, b.sweep, b.e, b.per_mb_layers * (2.0 + b.full) * (1 + bubble_share))


def _pp_comm(b: _Basis) -> np.ndarray:
    """Pipeline sends: activations forward, gradients back, per micro-batch per boundary."""
    cl = b.sweep.cluster
    ranks_per_stage = b.tp * b.cp * b.dp
    gbps = np.where(ranks_per_stage >= cl.gpus_per_node, cl.gpu.inter_gbps, cl.gpu.intra_gbps)
    sends = 2 * b.accum * b.chunks + 2 * (b.pp - 1) * b.chunks  # the steady state plus fill and drain
    sent = b.act_bytes / np.where(b.cols["effective_sp"], b.tp, 1.0)
    return np.where(b.pp > 1, sends * (sent / (gbps * GIGA) + b.traits.p2p_latency_s), 0.0)


def _dp_comm(b: _Basis, work: np.ndarray, groups: ReductionGroups) -> tuple[np.ndarray, np.ndarray]:
    """Data parallel, exposed and raw: fp32 gradient all-reduce (DDP), reduce-scatter + bf16
    all-gather (ZeRO-1 / distributed optimizer), or FSDP's per-use gathers and reductions; dense
    parameters over dp*cp, a mixture's routed experts over expert data parallel (estimate.moe)."""
    gpu, cl, e, traits = b.sweep.cluster.gpu, b.sweep.cluster, b.e, b.traits
    sharding = b.cols["sharding"]
    zero1, fsdp = sharding == "zero1", sharding == "fsdp"
    reduce_raw = np.zeros(len(b.tp))
    for group_params, ranks, stride in groups:
        ar_bw = bus_gbps(gpu, cl.gpus_per_node, ranks, stride, gather=False)
        ag_bw = bus_gbps(gpu, cl.gpus_per_node, ranks, stride, gather=True)
        reduce_raw = reduce_raw + np.where(
            zero1,
            gather_s(group_params * 4.0, ranks, ag_bw) + gather_s(group_params * e, ranks, ag_bw),
            allreduce_s(group_params * 4.0, ranks, ar_bw),
        )
    params = sum(g[0] for g in groups)
    replicas = b.dp * b.cp  # what FSDP shards over
    ag_bw = bus_gbps(gpu, cl.gpus_per_node, replicas, b.tp, gather=True)
    per_mb_sync = (sharding == "none") & (b.pp > 1) & traits.grad_sync_per_microbatch_pp
    reduce_raw = np.where(per_mb_sync, reduce_raw * b.accum, reduce_raw)
    last_backward = (2.0 / 3.0) * work / b.accum
    fsdp_volume = np.where(b.pp > 1, 1.0, b.accum) * (2 * params * e) + params * 4.0  # gathers (+per mb) + RS
    fsdp_raw = np.where(replicas > 1, (replicas - 1) / np.maximum(replicas, 1) * fsdp_volume / (ag_bw * GIGA), 0.0)
    raw = np.where(fsdp, fsdp_raw, reduce_raw)
    exposed = np.where(
        fsdp,
        np.maximum(fsdp_raw - FSDP_OVERLAP * work, 0.1 * fsdp_raw),
        np.maximum(reduce_raw - traits.dp_overlap * np.where(per_mb_sync, 0.0, last_backward), 0.0),
    )
    return exposed, raw


def _optimizer(b: _Basis, groups: ReductionGroups) -> np.ndarray:
    """Fused AdamW streams its states once per step (sharded by ZeRO-1 and FSDP)."""
    unsharded = b.cols["sharding"] == "none"
    params = sum(p / np.where(unsharded, 1.0, np.maximum(n, 1)) for p, n, _ in groups)
    return np.asarray(params * OPTIMIZER_BYTES / (b.sweep.cluster.gpu.hbm_gbps * GIGA))


def predict_table(cols: Columns, sweep: Sweep, calibration: Calibration, traits: TimeTraits) -> StepTime:
    """`predict` from the GPU table's figures and the trainer's traits, part by part."""
    b = _basis(cols, sweep, traits)
    matmul, expert_matmul, expert_per_flop = _matmuls(b)
    attention, re_attention = _attention(b)
    memory_bound = _memory_bound(b)
    framework, re_framework = _framework(b)
    recompute = _recompute_matmuls(b, expert_per_flop) + re_attention + re_framework
    # the allocator's slowdown multiplies all of the above, so it is priced on their sum
    framework = framework + _memory_pressure(
        b, matmul + expert_matmul + attention + memory_bound + framework + recompute
    )
    work = matmul + expert_matmul + attention + memory_bound + framework + recompute
    bubble_share = _bubble_share(b)
    groups = reduction_groups(cols, sweep)
    dp_comm, dp_raw = _dp_comm(b, work, groups)
    cp_comm, cp_raw = _cp_comm(b, attention + re_attention, bubble_share)
    parts = {
        "matmul": matmul,
        "expert_matmul": expert_matmul,
        "attention": attention,
        "memory_bound": memory_bound,
        "framework": framework + _pp_stall(b),
        "recompute": recompute,
        "bubble": work * bubble_share,
        "optimizer": _optimizer(b, groups),
        "tp_comm": _tp_comm(b, bubble_share),
        "cp_comm": cp_comm,
        "ep_comm": _ep_comm(b, bubble_share),
        "pp_comm": _pp_comm(b),
        "dp_comm": dp_comm,
        "dp_hidden": np.maximum(dp_raw - dp_comm, 0.0),
        "cp_hidden": cp_raw - cp_comm,
    }
    compute = sum(parts[k] for k in COMPUTE_PARTS)
    comm = sum(parts[k] for k in COMM_PARTS)
    step = calibration.compute_scale * compute + calibration.comm_scale * comm
    flops = model_flops_per_token(sweep.model, sweep.seq_len) * sweep.global_batch_size * sweep.seq_len
    mfu = flops / (step * sweep.cluster.world * b.peak)
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
