"""Analytic peak memory per GPU (the most loaded rank) for any layout, vectorised over layouts.

Activations start from Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", section 4: s*b*h*(34 + 5*a*s/h) bytes per GPT layer in 16-bit) and are
re-derived tensor by tensor for the block the built-in trainer runs: RMSNorm (no biases),
RoPE, grouped-query attention, SwiGLU, no dropout. Each term below names the tensors that
autograd keeps; tests/trainer check the sums against what the trainer really saves.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sweeper.hardware import GIB
from sweeper.layout import Columns
from sweeper.spec import Sweep

# Attention kernels that keep the s x s probabilities for backward, and how many bytes per
# score they keep: the softmax output in fp32 (softmax runs in fp32 under bf16 autocast, and
# in the eager kernel by construction) plus the 16-bit copy the second matmul saves.
SCORE_KERNELS = ("eager", "sdpa_math", "fused_softmax")

# Mixed-precision AdamW as the trainer runs it (fp32 master weights, bf16 compute copies):
# weights 4 + 2, gradients 4, Adam moments 4 + 4 = 18 bytes per parameter unsharded.
MASTER_BYTES = 4
GRAD_BYTES = 4
ADAM_BYTES = 8

# Fixed per-process cost outside the tensors: CUDA context and kernels (~0.5-1 GiB), NCCL
# communicator buffers (~0.25 GiB per communicator); on CPU the interpreter, torch and gloo.
CUDA_BASE_GIB = 1.0
CUDA_PER_COMM_GIB = 0.25
CPU_BASE_GIB = 0.3

BREAKDOWN = ("weights", "grads", "optimizer", "activations", "logits", "overhead")


@dataclass(frozen=True)
class Estimate:
    """Peak bytes per GPU by term (arrays, one entry per layout) and the usable capacity."""

    weights: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    logits: np.ndarray
    overhead: np.ndarray
    capacity_bytes: float

    @property
    def total(self) -> np.ndarray:
        return self.weights + self.grads + self.optimizer + self.activations + self.logits + self.overhead

    @property
    def fits(self) -> np.ndarray:
        return self.total <= self.capacity_bytes

    def gib(self) -> dict[str, np.ndarray]:
        """Every term and the total, in GiB, as `mem_<term>_gib` columns."""
        out = {f"mem_{k}_gib": getattr(self, k) / GIB for k in BREAKDOWN}
        out["mem_total_gib"] = self.total / GIB
        return out


def compute_bytes(sweep: Sweep) -> int:
    """Bytes per activation element: 2 under bf16 autocast, 4 in fp32."""
    return 2 if sweep.trial.precision == "bf16" else 4


def layer_params_per_rank(cols: Columns, sweep: Sweep) -> np.ndarray:
    """One block's parameters on one tensor-parallel rank: matrices split by tp, norms replicated."""
    m = sweep.model
    return (m.attention_params + m.mlp_params) / cols["tp"] + 2 * m.hidden


def stage_params(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """Parameters on a rank of the first and of the last pipeline stage (tp-split).

    The first stage holds the embedding (vocab-parallel under tp); the last holds the final
    norm and the output head (or, when tied and pp > 1, its own copy of the embedding).
    """
    m = sweep.model
    pp = cols["pp"]
    blocks = (m.layers / pp) * layer_params_per_rank(cols, sweep)
    embed = m.vocab * m.hidden / cols["tp"]
    head = embed if not m.tied_embeddings else np.where(pp > 1, embed, 0.0)
    first = blocks + embed + np.where(pp == 1, head + m.hidden, 0.0)
    last = np.where(pp == 1, first, blocks + head + m.hidden)
    return first, last


def _per_token_terms(cols: Columns, sweep: Sweep) -> dict[str, np.ndarray]:
    """Bytes per token that one block keeps for backward, by part, for each checkpointing mode.

    With e bytes per element, t = tp, r = 1/t under sequence parallel (else 1), q = heads*head_dim
    (the Q projection's width: h unless head_dim is set) and kv = kv_heads*head_dim:
      norm       see `norm_bytes` (RMSNorm or LayerNorm)
      linear in  q/k/v and w1/w3 (GPT: fc1) read the all-gathered norm output: e*h each (DTensor keeps it)
      attention  flash-like: q, k, v (after RoPE, or views of the projections without it)
                 (e*(q + 2*kv)/t), output (e*q/t), log-sum-exp (4*a/t); its output is already laid
                 out for the o-projection (a view, no copy);
                 score kernels: q and k, v expanded to all heads (3*e*q/t), the probabilities
                 (fp32 softmax output plus the e-byte copy the matmul keeps: (4 + e) bytes per
                 score when e < 4; a*s scores per token, /t) and the o-projection's input, made
                 contiguous (e*q/t)
      mlp        SwiGLU: w1 out, silu out, w3 out, w2 input: 4*e*ffn/t; GELU: fc1 out (GELU's
                 input) and GELU out (fc2's input): 2*e*ffn/t. Biases add no saved tensor (the
                 linear layers run as addmm, which keeps its two matrix inputs only).
    Checked against what the trainer saves (saved-tensor hooks) in tests/trainer.
    """
    m = sweep.model
    e = compute_bytes(sweep)
    s, h, a, q, kv, f = sweep.seq_len, m.hidden, m.heads, m.q_dim, m.kv_dim, m.ffn
    mlp_tensors = 2 if m.mlp == "gelu" else 4  # activations of the ffn width the MLP keeps
    t = cols["tp"].astype(float)
    sp = cols["sequence_parallel"].astype(bool) & (t > 1)
    r = np.where(sp, 1.0 / t, 1.0)
    scores = np.isin(cols["attention"], SCORE_KERNELS)
    norm = norm_bytes(cols, sweep, r)
    score_bytes = 4 + (e if e < 4 else 0)
    attn_core = np.where(
        scores,
        3 * e * q / t + score_bytes * a * s / t + e * q / t,
        e * (q + 2 * kv) / t + e * q / t + 4 * a / t,
    )
    attention = norm + e * h + attn_core
    mlp = norm + e * h + mlp_tensors * e * f / t
    block_in = e * h * r
    # selective: the block input plus every matmul / attention output (row-parallel matmul
    # outputs are full size on each rank, before their reduction) and, under sequence
    # parallel, the two reduce-scatter outputs (torchtitan's policy keeps them); the MLP's
    # matmuls before the nonlinearity are w1 and w3 (SwiGLU) or fc1 (GELU)
    kept_attn = np.where(scores, e * a * s / t + e * q / t, e * q / t + 4 * a / t)
    up = (mlp_tensors // 2) * e * f / t
    selective = block_in + e * (q + 2 * kv) / t + kept_attn + e * h + up + e * h
    selective = selective + np.where(sp, 2 * e * h / t, 0.0)
    return {"attention": attention, "mlp": mlp, "block_in": block_in, "selective": selective}


def norm_bytes(cols: Columns, sweep: Sweep, r: np.ndarray) -> np.ndarray:
    """Bytes per token a norm keeps (its share of the sequence r under sequence parallel).

    RMSNorm: fused e*h*r + 4*r (input, rstd); eager 4*h*r + 4*r + e*h*r (the fp32 copy of the
    input that pow keeps, rstd, the value before the weight).
    LayerNorm: fused (torch's native layer_norm) its input, mean and rstd: e*h*r + 8*r, where the
    input is an fp32 copy (4*h*r) under bf16 autocast, which runs layer_norm in fp32 on CUDA (torch's
    AMP op reference, "CUDA Ops that can autocast to float32"); eager (plain
    ops) the centred fp32 input, rstd and the value before the weight: as eager RMSNorm.
    """
    e, h = compute_bytes(sweep), sweep.model.hidden
    eager = cols["rmsnorm"] == "eager"
    if sweep.model.norm == "layernorm":
        # bf16 autocast is on unless FSDP's mixed precision casts the weights instead
        autocast = (e < 4) & ~((cols["sharding"] == "fsdp") & (cols["dp"] > 1))
        fused_in = np.where(autocast, 4.0, float(e))
        return np.where(eager, 4 * h * r + 4 * r + e * h * r, fused_in * h * r + 8 * r)
    return np.where(eager, 4 * h * r + 4 * r + e * h * r, e * h * r + 4 * r)


def layer_activation_bytes(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """(kept, transient) bytes of one block for one micro-batch.

    kept: what stays until that micro-batch's backward; transient: what recomputation
    materialises for one block at a time during backward (full: the whole block; ffn: the MLP).
    """
    p = _per_token_terms(cols, sweep)
    mode = cols["activation_checkpointing"]
    tokens = sweep.seq_len * cols["micro_batch_size"]
    none = p["attention"] + p["mlp"]
    kept = np.select(
        [mode == "none", mode == "full", mode == "ffn", mode == "selective"],
        [none, p["block_in"], p["attention"] + p["block_in"], p["selective"]],
        default=np.nan,
    )
    transient = np.select([mode == "full", mode == "ffn"], [none, p["mlp"]], default=0.0)
    return kept * tokens, transient * tokens


def microbatches_in_flight(cols: Columns) -> tuple[np.ndarray, np.ndarray]:
    """Micro-batch x block activations held by the first and the last pipeline stage, in blocks of L/pp.

    1F1B: the first stage runs pp forwards before its first backward (Korthikanti et al. 4.2.3:
    the same L layers' worth as without pipelining); GPipe: every micro-batch; interleaved
    (torch ScheduleInterleaved1F1B): rank 0 warms up (v-1)*pp + 2*(pp-1) chunks of L/(pp*v)
    layers, which equals Korthikanti's L*(1 + (pp-1)/(pp*v)). The last stage holds one
    micro-batch under 1F1B schedules.
    """
    pp, m, v = cols["pp"], cols["grad_accum"], cols["chunks"].astype(float)
    sched = cols["pp_schedule"]
    one_f_one_b = np.minimum(pp, m).astype(float)
    interleaved = np.minimum((v - 1) * pp + 2 * (pp - 1) + 1, m * v) / v
    first = np.select([pp == 1, sched == "gpipe", v > 1], [1.0, m.astype(float), interleaved], default=one_f_one_b)
    last = np.where((pp > 1) & (sched == "gpipe"), m.astype(float), 1.0)
    return first, last


def logits_bytes(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """(kept per micro-batch, transient) bytes of the output layer on the last stage.

    Kept: the final norm (as a block's norm), the output projection's input (e*h, all of h
    even under sequence parallel), and the fp32 log-softmax of cross-entropy (4 bytes per
    logit, vocab split by tp under loss parallel). Transient, while the loss and its gradient
    are formed: the e-byte logits and an fp32 gradient at once (e + 4 bytes per logit).
    """
    e = compute_bytes(sweep)
    t = cols["tp"].astype(float)
    r = np.where(cols["sequence_parallel"].astype(bool) & (t > 1), 1.0 / t, 1.0)
    tokens = sweep.seq_len * cols["micro_batch_size"]
    logits = tokens * sweep.model.vocab / t
    head_in = tokens * (norm_bytes(cols, sweep, r) + e * sweep.model.hidden)
    return 4.0 * logits + head_in, (e + 4.0) * logits


def overhead_bytes(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Fixed per-process memory: the user's figure, else by device type and communicators."""
    if sweep.memory.overhead_gib is not None:
        return np.full(np.shape(cols["tp"]), sweep.memory.overhead_gib * GIB)
    if sweep.cluster.gpu.name == "cpu":
        return np.full(np.shape(cols["tp"]), CPU_BASE_GIB * GIB)
    comms = (cols["tp"] > 1).astype(int) + (cols["pp"] > 1) + (cols["dp"] > 1)
    return (CUDA_BASE_GIB + CUDA_PER_COMM_GIB * comms) * GIB


def state_bytes(cols: Columns, sweep: Sweep, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, grads, optimizer) bytes for `params` parameters on a rank, by sharding mode.

    none (DDP): 4 master + 2 compute copy, 4 grad, 8 Adam per parameter. zero1 (DDP with a
    ZeRO-1 optimizer): Adam states / dp. fsdp (FSDP2): master, grads and Adam / dp, plus the
    unsharded 16-bit parameters of two blocks (the one computing and the one prefetched) and
    one block's unsharded gradient (e bytes) with its fp32 reduce-scatter buffer; with pp > 1
    the stage keeps its parameters unsharded across micro-batches (no re-gather per micro-batch)
    and its whole unsharded fp32 gradient until the last micro-batch (gradients are reduced
    once, after the schedule).
    """
    e = compute_bytes(sweep)
    dp = np.maximum(cols["dp"], 1).astype(float)
    sharding = cols["sharding"]
    copy = e if e < 4 else 0  # the 16-bit compute copy; none when computing in fp32
    fsdp = sharding == "fsdp"
    unit = np.maximum(layer_params_per_rank(cols, sweep), sweep.model.vocab * sweep.model.hidden / cols["tp"])
    gathered = np.where(cols["pp"] > 1, params * e, 2 * unit * e)
    weights = np.where(fsdp, MASTER_BYTES * params / dp + gathered, (MASTER_BYTES + copy) * params)
    unsharded_grads = np.where(cols["pp"] > 1, GRAD_BYTES * params, unit * (e + 4))
    grads = np.where(fsdp, GRAD_BYTES * params / dp + unsharded_grads, GRAD_BYTES * params)
    optimizer = np.where(sharding == "none", ADAM_BYTES * params, ADAM_BYTES * params / dp)
    return weights, grads, optimizer


def estimate(cols: Columns, sweep: Sweep) -> Estimate:
    """Peak memory per GPU for every layout in `cols` (derived columns included).

    Both ends of the pipeline are estimated (the first holds the embedding and the most
    micro-batches in flight, the last the head and the logits); the larger total is reported.
    """
    kept, transient = layer_activation_bytes(cols, sweep)
    blocks = sweep.model.layers / cols["pp"]
    inflight_first, inflight_last = microbatches_in_flight(cols)
    logit_kept, logit_transient = logits_bytes(cols, sweep)
    params_first, params_last = stage_params(cols, sweep)
    single = cols["pp"] == 1

    first_state = state_bytes(cols, sweep, params_first)
    last_state = state_bytes(cols, sweep, params_last)
    first_act = inflight_first * blocks * kept + transient
    last_act = inflight_last * blocks * kept + transient
    first_logits = np.where(single, logit_kept + logit_transient, 0.0)
    last_logits = inflight_last * logit_kept + logit_transient
    first_total = sum(first_state) + first_act + first_logits
    last_total = sum(last_state) + last_act + last_logits
    use_last = ~single & (last_total > first_total)

    def pick(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.where(use_last, b, a)

    weights, grads, optimizer = (pick(a, b) for a, b in zip(first_state, last_state))
    capacity = sweep.cluster.gpu.memory_gib * GIB * (1 - sweep.memory.headroom)
    return Estimate(
        weights, grads, optimizer, pick(first_act, last_act), pick(first_logits, last_logits),
        overhead_bytes(cols, sweep), capacity,
    )
