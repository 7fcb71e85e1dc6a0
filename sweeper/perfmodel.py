"""Analytic step time and MFU of a layout on the sweep's cluster, vectorised over layouts.

Not a simulator: a ranking model. It splits a step into compute (matmuls at an achievable
share of peak that shrinks with the GEMM size, attention with or without s x s traffic,
memory-bound elementwise work that fused norms and compile cut down, recomputation), the
pipeline bubble `(pp-1)/(m+pp-1)` (interleaved: divided by the virtual stages), and
communication (tensor-parallel all-reduces on the node's links, pipeline sends, the
data-parallel gradient reduction minus what overlaps backward). Two scale factors, one for
compute and one for communication, are fitted to measured step times as trials finish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sweeper.flops import model_flops_per_token
from sweeper.layout import Columns
from sweeper.memory import SCORE_KERNELS, compute_bytes
from sweeper.spec import Sweep
from sweeper.stages import pipeline_shapes, stage_layers, stage_params

GIGA = 1e9
MATMUL_EFFICIENCY = 0.80  # large bf16 GEMMs on datacenter GPUs reach ~75-85 % of peak
GEMM_HALF_SIZE = 0.5  # M*N (in 2^20 elements) at which a GEMM reaches half its efficiency
# flash-style attention kernels, share of peak (FlashAttention-2 reports ~2x FlashAttention-1)
FLASH_EFFICIENCY = {"flash1": 0.40, "flash2": 0.65, "sdpa_efficient": 0.45, "cudnn": 0.68}
SCORE_BYTES = {"eager": 30.0, "sdpa_math": 30.0, "fused_softmax": 12.0}  # HBM bytes per score, fwd + bwd
NORM_PASSES = {"eager": 16.0, "fused": 6.0}  # HBM passes over h per norm, fwd + bwd
COMPILE_ELEMENTWISE = 0.5  # share of elementwise traffic left after torch.compile's fusion
FLOAT8_SPEEDUP = 1.6  # float8 matmuls net of the casts
LAYER_OVERHEAD_S = 30e-6  # launch and framework cost per block per micro-batch (fwd + bwd)
DDP_OVERLAP = 0.7  # share of the gradient reduction hidden behind the last backward
FSDP_OVERLAP = 0.85  # share of FSDP's gathers and reductions hidden by prefetching


@dataclass(frozen=True)
class Calibration:
    """Multipliers fitted to measurements: step = compute_scale*compute + comm_scale*comm."""

    compute_scale: float = 1.0
    comm_scale: float = 1.0
    trials: int = 0


@dataclass(frozen=True)
class StepTime:
    """Seconds per optimizer step by part (arrays over layouts) and the predicted MFU."""

    compute: np.ndarray  # matmuls, attention, elementwise, recomputation, with the bubble
    comm: np.ndarray  # exposed tensor-, pipeline- and data-parallel communication
    calibration: Calibration
    mfu: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.calibration.compute_scale * self.compute + self.calibration.comm_scale * self.comm


def _allreduce_s(nbytes: np.ndarray, ranks: np.ndarray, gbps: np.ndarray | float) -> np.ndarray:
    """Ring all-reduce: each rank sends and receives 2*(n-1)/n of the buffer."""
    return np.where(ranks > 1, 2 * (ranks - 1) / np.maximum(ranks, 1) * nbytes / (gbps * GIGA), 0.0)


def predict(cols: Columns, sweep: Sweep, calibration: Calibration = Calibration()) -> StepTime:
    """Step time and MFU for every layout in `cols` (derived columns included)."""
    m, gpu, cl = sweep.model, sweep.cluster.gpu, sweep.cluster
    s, L, h, f, a = sweep.seq_len, m.layers, m.hidden, m.ffn, m.heads
    e = compute_bytes(sweep)
    tp, pp, dp = (cols[k].astype(float) for k in ("tp", "pp", "dp"))
    mbs, accum = cols["micro_batch_size"].astype(float), np.maximum(cols["grad_accum"], 1).astype(float)
    world = cl.world
    peak = gpu.peak_flops(sweep.trial.precision)
    tokens_gpu = sweep.global_batch_size * s / world  # tokens per step, per GPU share of the model
    mode = cols["activation_checkpointing"]

    # uneven stages: the pipeline runs at the pace of its most loaded rank
    busiest = busiest_stage_layers(cols, L)
    imbalance = busiest * pp / L

    # --- compute: weight matmuls (fwd 2N, bwd 4N, + recomputed forwards) -----------------
    w_flops = 6.0 * m.num_params + np.select(
        [mode == "full", mode == "ffn"], [2.0 * L * m.layer_params, 2.0 * L * m.mlp_params], 0.0
    )
    gemm = (mbs * s) * (h / tp) / 2**20
    eff = MATMUL_EFFICIENCY * gemm / (gemm + GEMM_HALF_SIZE)
    eff = eff * np.where(cols["compile"].astype(bool), 1.03, 1.0)
    eff = eff * np.where(cols["float8"].astype(bool) & gpu.supports_fp8, FLOAT8_SPEEDUP, 1.0)
    matmul = w_flops * tokens_gpu / (peak * eff)

    # --- attention: flash-like at a share of peak; score kernels add s x s HBM traffic ----
    q = m.q_dim  # heads x head_dim: the width the scores and values are computed over
    a_flops = 12.0 * L * q * s + np.where(mode == "full", 4.0 * L * q * s, 0.0)
    scores = np.isin(cols["attention"], SCORE_KERNELS)
    flash_eff = np.select([cols["attention"] == k for k in FLASH_EFFICIENCY], list(FLASH_EFFICIENCY.values()), 0.5)
    attn_eff = np.where(scores, eff, flash_eff)
    score_bytes = np.select(
        [cols["attention"] == k for k in SCORE_KERNELS], [SCORE_BYTES[k] for k in SCORE_KERNELS], 0.0
    )
    attention = a_flops * tokens_gpu / (peak * attn_eff) + L * a * s * score_bytes * tokens_gpu / (gpu.hbm_gbps * GIGA)

    # --- elementwise: norms (replicated over tp without sequence parallel), RoPE, SwiGLU --
    sp = cols["effective_sp"]
    norm_passes = np.where(cols["rmsnorm"] == "fused", NORM_PASSES["fused"], NORM_PASSES["eager"])
    norm_bytes = 2 * norm_passes * h * e * np.where(sp, 1.0, tp)  # per token per layer, this GPU's share x tp
    other_bytes = (12 * (h + 2 * m.kv_dim) + 18 * f + 12 * h) * e
    elementwise = L * (norm_bytes + other_bytes) * tokens_gpu / (gpu.hbm_gbps * GIGA)
    elementwise = elementwise * np.where(cols["compile"].astype(bool), COMPILE_ELEMENTWISE, 1.0)

    per_mb_layers = busiest * accum  # block passes the busiest GPU runs per step
    framework = LAYER_OVERHEAD_S * per_mb_layers * np.where(mode == "full", 1.5, 1.0)
    work = (matmul + attention + elementwise) * imbalance + framework

    # --- pipeline bubble ------------------------------------------------------------------
    chunks = cols["chunks"].astype(float)
    bubble = np.where(pp > 1, (pp - 1) / chunks / accum, 0.0)
    compute = work * (1 + bubble)

    # --- tensor parallel: 4 all-reduces per block per micro-batch (6 with full recompute) --
    act_bytes = mbs * s * h * e
    tp_per_block = _allreduce_s(act_bytes, tp, gpu.intra_gbps) * np.where(mode == "full", 6, 4)
    tp_comm = tp_per_block * per_mb_layers * (1 + bubble)

    # --- pipeline sends: activations forward, gradients back, per micro-batch per boundary --
    ranks_per_stage = tp * dp
    pp_gbps = np.where(ranks_per_stage >= cl.gpus_per_node, gpu.inter_gbps, gpu.intra_gbps)
    pp_comm = np.where(pp > 1, 2 * act_bytes / np.where(sp, tp, 1.0) * accum * chunks / (pp_gbps * GIGA), 0.0)

    # --- data parallel: gradient all-reduce (DDP/ZeRO-1) or FSDP's gathers and reductions --
    first, last = stage_params(cols, sweep)
    params = np.maximum(first, last)
    dp_gbps = np.where(tp * dp > cl.gpus_per_node, gpu.inter_gbps, gpu.intra_gbps)
    grad_reduce = _allreduce_s(params * 4.0, dp, dp_gbps)
    last_backward = (2.0 / 3.0) * work / accum
    fsdp = cols["sharding"] == "fsdp"
    fsdp_volume = np.where(pp > 1, 1.0, accum) * (2 * params * e) + params * 4.0  # gathers (+per micro-batch) + RS
    fsdp_comm = np.where(dp > 1, (dp - 1) / np.maximum(dp, 1) * fsdp_volume / (dp_gbps * GIGA), 0.0)
    dp_comm = np.where(
        fsdp,
        np.maximum(fsdp_comm - FSDP_OVERLAP * work, 0.1 * fsdp_comm),
        np.maximum(grad_reduce - DDP_OVERLAP * last_backward, 0.0),
    )

    comm = tp_comm + pp_comm + dp_comm
    step = calibration.compute_scale * compute + calibration.comm_scale * comm
    mfu = model_flops_per_token(m, s) * sweep.global_batch_size * s / (step * world * peak)
    return StepTime(compute, comm, calibration, mfu)


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
PARTS = (
    "matmul",
    "attention",
    "memory_bound",
    "framework",
    "recompute",
    "bubble",
    "tp_comm",
    "pp_comm",
    "dp_comm",
    "dp_hidden",
)
PART_LABELS = {
    "matmul": "matmul compute",
    "attention": "attention",
    "memory_bound": "memory-bound (norms, elementwise)",
    "framework": "launch / framework",
    "recompute": "recomputation",
    "bubble": "pipeline bubble",
    "tp_comm": "tensor-parallel comm",
    "pp_comm": "pipeline comm",
    "dp_comm": "data-parallel comm (exposed)",
    "dp_hidden": "data-parallel comm (hidden)",
}


def breakdown(cols: Columns, sweep: Sweep, calibration: Calibration = Calibration()) -> dict[str, np.ndarray]:
    """Seconds per step by part, for every layout: the parts of `PARTS`, and `forward` (for shares).

    The same physics as `predict`, split finer: recomputation apart from the first pass, the
    bubble apart from the work it idles on, data-parallel traffic hidden behind backward apart
    from what is exposed. Every part but `dp_hidden` (overlapped, so not on the step's critical
    path) is exposed, and compute parts and communication parts are rescaled to add up to
    `predict`'s compute and comm exactly, so the bars agree with the predicted step time even
    where `predict` has refinements this split does not repeat.
    """
    m, gpu, cl = sweep.model, sweep.cluster.gpu, sweep.cluster
    s, L, h, a = sweep.seq_len, m.layers, m.hidden, m.heads
    e = compute_bytes(sweep)
    tp, pp, dp = (cols[k].astype(float) for k in ("tp", "pp", "dp"))
    mbs, accum = cols["micro_batch_size"].astype(float), np.maximum(cols["grad_accum"], 1).astype(float)
    peak = gpu.peak_flops(sweep.trial.precision)
    tokens_gpu = sweep.global_batch_size * s / cl.world
    mode = cols["activation_checkpointing"]
    gemm = (mbs * s) * (h / tp) / 2**20
    eff = MATMUL_EFFICIENCY * gemm / (gemm + GEMM_HALF_SIZE)
    eff = eff * np.where(cols["compile"].astype(bool), 1.03, 1.0)
    eff = eff * np.where(cols["float8"].astype(bool) & gpu.supports_fp8, FLOAT8_SPEEDUP, 1.0)
    per_flop = tokens_gpu / (peak * eff)
    matmul = 6.0 * m.num_params * per_flop
    re_matmul = (
        np.select([mode == "full", mode == "ffn"], [2.0 * L * m.layer_params, 2.0 * L * m.mlp_params], 0.0) * per_flop
    )
    scores = np.isin(cols["attention"], SCORE_KERNELS)
    flash_eff = np.select([cols["attention"] == k for k in FLASH_EFFICIENCY], list(FLASH_EFFICIENCY.values()), 0.5)
    attn_per_flop = tokens_gpu / (peak * np.where(scores, eff, flash_eff))
    score_bytes = np.select(
        [cols["attention"] == k for k in SCORE_KERNELS], [SCORE_BYTES[k] for k in SCORE_KERNELS], 0.0
    )
    attention = 12.0 * L * h * s * attn_per_flop + L * a * s * score_bytes * tokens_gpu / (gpu.hbm_gbps * GIGA)
    re_attention = np.where(mode == "full", 4.0 * L * h * s, 0.0) * attn_per_flop
    sp = cols["sequence_parallel"].astype(bool) & (tp > 1)
    norm_passes = np.where(cols["rmsnorm"] == "fused", NORM_PASSES["fused"], NORM_PASSES["eager"])
    other_bytes = (12 * (h + 2 * m.kv_dim) + 18 * m.ffn + 12 * h) * e
    memory_bound = (
        L * (2 * norm_passes * h * e * np.where(sp, 1.0, tp) + other_bytes) * tokens_gpu / (gpu.hbm_gbps * GIGA)
    )
    memory_bound = memory_bound * np.where(cols["compile"].astype(bool), COMPILE_ELEMENTWISE, 1.0)
    framework = LAYER_OVERHEAD_S * (L / pp) * accum
    re_framework = np.where(mode == "full", 0.5 * framework, 0.0)
    work = matmul + re_matmul + attention + re_attention + memory_bound + framework + re_framework
    bubble = work * np.where(pp > 1, (pp - 1) / cols["chunks"].astype(float) / accum, 0.0)
    compute = {
        "matmul": matmul,
        "attention": attention,
        "memory_bound": memory_bound,
        "framework": framework,
        "recompute": re_matmul + re_attention + re_framework,
        "bubble": bubble,
    }
    # communication: the exposed parts from predict's own arithmetic, split by kind
    full = predict(cols, sweep, calibration)
    tp_comm = (
        _allreduce_s(mbs * s * h * e, tp, gpu.intra_gbps)
        * np.where(mode == "full", 6, 4)
        * (L / pp)
        * accum
        * (1 + bubble / np.maximum(work, 1e-30))
    )
    act_bytes = mbs * s * h * e
    pp_gbps = np.where(tp * dp >= cl.gpus_per_node, gpu.inter_gbps, gpu.intra_gbps)
    pp_comm = np.where(pp > 1, 2 * act_bytes / np.where(sp, tp, 1.0) * accum * cols["chunks"] / (pp_gbps * GIGA), 0.0)
    dp_exposed = np.maximum(full.comm - tp_comm - pp_comm, 0.0)
    first, last = stage_params(cols, sweep)
    params = np.maximum(first, last)
    dp_gbps = np.where(tp * dp > cl.gpus_per_node, gpu.inter_gbps, gpu.intra_gbps)
    fsdp_volume = np.where(pp > 1, 1.0, accum) * (2 * params * e) + params * 4.0
    dp_raw = np.where(
        cols["sharding"] == "fsdp",
        np.where(dp > 1, (dp - 1) / np.maximum(dp, 1) * fsdp_volume / (dp_gbps * GIGA), 0.0),
        _allreduce_s(params * 4.0, dp, dp_gbps),
    )
    comm = {"tp_comm": tp_comm, "pp_comm": pp_comm, "dp_comm": dp_exposed}
    out = _rescaled(compute, full.compute * calibration.compute_scale)
    out |= _rescaled(comm, full.comm * calibration.comm_scale)
    out["dp_hidden"] = np.maximum(dp_raw - dp_exposed, 0.0) * calibration.comm_scale
    out["forward"] = (
        (matmul + attention)
        / 3.0
        * calibration.compute_scale
        * (full.compute / np.maximum(sum(compute.values()), 1e-30))
    )  # first forward pass: a third of fwd + bwd
    return out


def _rescaled(parts: dict[str, np.ndarray], total: np.ndarray) -> dict[str, np.ndarray]:
    """The parts scaled to add up to `total` (unchanged where they add up to nothing)."""
    got = sum(parts.values())
    k = np.where(got > 0, total / np.where(got > 0, got, 1.0), 1.0)
    return {name: v * k for name, v in parts.items()}
