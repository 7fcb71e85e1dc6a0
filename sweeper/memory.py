"""Analytic peak memory per GPU (the most loaded rank) for any layout, vectorised over layouts.

Activations start from Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", section 4: s*b*h*(34 + 5*a*s/h) bytes per GPT layer in 16-bit) and are
re-derived tensor by tensor for the block the built-in trainer runs: RMSNorm (no biases),
RoPE, grouped-query attention, SwiGLU, no dropout. Each term below names the tensors that
autograd keeps; tests/trainer check the sums against what the trainer really saves.

Model states follow the trainer the user runs (`memory.recipe`, see `recipe_bytes`): what each
value of the `sharding` knob costs in that trainer. Around the tensors: transient buffers
(gradient-reduction buckets, pipeline send/receive buffers, gathered FSDP units) make the
allocated peak; the caching allocator's gap on top of it makes the reserved peak, which plus
the fixed per-process overhead is what must fit the card. Pipeline stages need not be even
(`sweeper.stages.split_layers`): every stage is estimated and the most loaded one reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sweeper.hardware import GIB
from sweeper.knobs import KNOBS
from sweeper.layout import Columns
from sweeper.spec import StateBytes, Sweep
from sweeper.stages import split_layers

# Attention kernels that keep the s x s probabilities for backward, and how many bytes per
# score they keep: the softmax output in fp32 (softmax runs in fp32 under bf16 autocast, and
# in the eager kernel by construction) plus the 16-bit copy the second matmul saves.
SCORE_KERNELS = KNOBS["attention"].with_property("keeps_scores")

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

BREAKDOWN = ("weights", "grads", "optimizer", "activations", "logits", "buffers", "allocator", "overhead")

# Reserved / allocated of PyTorch's caching allocator per recipe (fragmentation and cached
# blocks). torchtitan's run_train.sh and the built-in trainer's default leave
# PYTORCH_CUDA_ALLOC_CONF alone except torchtitan's expandable_segments:True, which keeps
# the gap small; Megatron-LM and DeepSpeed logs typically show reserved 5-15 % above max
# allocated. A measured pair (Megatron's "max allocated / max reserved" line) refits it.
RESERVED_FACTOR = {"builtin": 1.05, "torchtitan": 1.03, "megatron": 1.10, "deepspeed": 1.10, "explicit": 1.10}

# DeepSpeed ZeRO defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size and
# allgather_bucket_size 5e8 elements, stage3_prefetch_bucket_size 5e7 elements.
DEEPSPEED_REDUCE_BUCKET = 5e8
DEEPSPEED_PREFETCH_BUCKET = 5e7


@dataclass(frozen=True)
class Estimate:
    """Peak bytes per GPU by term (arrays, one entry per layout) and the usable capacity."""

    weights: np.ndarray
    grads: np.ndarray
    optimizer: np.ndarray
    activations: np.ndarray
    logits: np.ndarray
    buffers: np.ndarray  # transient: reduction buckets, pipeline send/receive buffers
    allocator: np.ndarray  # reserved - allocated: the caching allocator's gap
    overhead: np.ndarray  # CUDA context, communicators: outside the allocator
    capacity_bytes: float
    recipe: str = "builtin"
    stage: np.ndarray | None = None  # the pipeline stage reported (the most loaded)

    @property
    def allocated(self) -> np.ndarray:
        """What torch.cuda.max_memory_allocated would report: every tensor at the peak."""
        return self.weights + self.grads + self.optimizer + self.activations + self.logits + self.buffers

    @property
    def reserved(self) -> np.ndarray:
        """What torch.cuda.max_memory_reserved would report: allocated plus the allocator's gap."""
        return self.allocated + self.allocator

    @property
    def total(self) -> np.ndarray:
        """The card's share taken: reserved plus the per-process overhead (what pruning compares)."""
        return self.reserved + self.overhead

    @property
    def fits(self) -> np.ndarray:
        return self.total <= self.capacity_bytes

    def gib(self) -> dict[str, np.ndarray]:
        """Every term, allocated, reserved and the total, in GiB, as `mem_<term>_gib` columns."""
        out = {f"mem_{k}_gib": getattr(self, k) / GIB for k in BREAKDOWN}
        out["mem_allocated_gib"] = self.allocated / GIB
        out["mem_reserved_gib"] = self.reserved / GIB
        out["mem_total_gib"] = self.total / GIB
        return out


def compute_bytes(sweep: Sweep) -> int:
    """Bytes per activation element: 2 under bf16 autocast, 4 in fp32."""
    return 2 if sweep.trial.precision == "bf16" else 4


def layer_params_per_rank(cols: Columns, sweep: Sweep) -> np.ndarray:
    """One block's parameters on one tensor-parallel rank: matrices split by tp, norms replicated."""
    m = sweep.model
    return (m.attention_params + m.mlp_params) / cols["tp"] + m.layer_norm_params


def stage_layers(layers: int, pp: int, chunks: int = 1) -> tuple[int, ...]:
    """Layers held by each pipeline rank: its chunks of `split_layers(layers, pp*chunks)`
    (chunk c runs on rank c mod pp, as Megatron-LM's and torch's interleaved schedules place them)."""
    split = split_layers(layers, pp * chunks)
    return tuple(sum(split[r::pp]) for r in range(pp))


def pipeline_shapes(cols: Columns) -> list[tuple[int, int]]:
    """The distinct (pp, chunks per rank) pairs among the layouts, in order."""
    # one int64 key per row (chunks < 2**20), then the distinct keys: a 1-D unique is fast
    key = np.asarray(cols["pp"], dtype=np.int64) * (1 << 20) + np.asarray(cols["chunks"], dtype=np.int64)
    return [(int(k) >> 20, int(k) & ((1 << 20) - 1)) for k in np.unique(key)]


def stage_params_at(
    cols: Columns, sweep: Sweep, layers: np.ndarray | float, *, first: np.ndarray | bool, last: np.ndarray | bool
) -> np.ndarray:
    """Parameters on a rank of a stage holding `layers` blocks (tp-split).

    The first stage holds the embedding (vocab-parallel under tp) and a learned position table
    (replicated, as Megatron-LM keeps it); the last the final norm and the output head (or,
    when tied and the stage is not also the first, its own copy of the embedding).
    """
    m = sweep.model
    embed = m.vocab * m.hidden / cols["tp"]
    head = np.where(first, 0.0, embed) if m.tied_embeddings else embed
    return (
        layers * layer_params_per_rank(cols, sweep)
        + np.where(first, embed + m.position_params, 0.0)
        + np.where(last, head + m.norm_params, 0.0)
    )


def stage_params(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """Parameters on a rank of the first and of the last pipeline stage (tp-split, uneven splits included)."""
    L = sweep.model.layers
    first_layers, last_layers = np.zeros(len(cols["pp"])), np.zeros(len(cols["pp"]))
    for p in np.unique(cols["pp"]):
        split = stage_layers(L, int(p)) if p <= L else (np.nan,)
        first_layers[cols["pp"] == p], last_layers[cols["pp"] == p] = split[0], split[-1]
    single = cols["pp"] == 1
    first = stage_params_at(cols, sweep, first_layers, first=True, last=single)
    last = np.where(single, first, stage_params_at(cols, sweep, last_layers, first=False, last=True))
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
    sp = cols["effective_sp"]
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


def microbatches_in_flight_at(cols: Columns, rank: int) -> np.ndarray:
    """Micro-batch x block activations pipeline rank `rank` holds, in units of its own layers.

    1F1B: rank i runs pp - i forwards before its first backward; GPipe: every micro-batch;
    interleaved: rank i warms up (v-1)*pp + 2*(pp-1-i) chunks (torch ScheduleInterleaved1F1B,
    Megatron-LM's interleaved schedule) plus the one in its first steady step.
    """
    pp, m, v = cols["pp"], cols["grad_accum"], cols["chunks"].astype(float)
    sched = cols["pp_schedule"]
    one_f_one_b = np.minimum(pp - rank, m).astype(float)
    interleaved = np.minimum((v - 1) * pp + 2 * (pp - 1 - rank) + 1, m * v) / v
    return np.select([pp == 1, sched == "gpipe", v > 1], [1.0, m.astype(float), interleaved], default=one_f_one_b)


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
    r = np.where(cols["effective_sp"], 1.0 / t, 1.0)
    tokens = sweep.seq_len * cols["micro_batch_size"]
    logits = tokens * sweep.model.vocab / t
    head_in = tokens * (norm_bytes(cols, sweep, r) + e * sweep.model.hidden)
    if sweep.memory.recipe == "torchtitan":
        loss_kept, loss_transient = torchtitan_loss_bytes(cols, sweep, e)
        return loss_kept * logits + head_in, loss_transient * logits
    # Megatron-LM's vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py)
    # casts the logits to fp32 and works in place on that copy, which it keeps: at the peak only
    # the e-byte logits coexist with the kept fp32 softmax, and its gradient reuses it in place
    transient = e if sweep.memory.recipe == "megatron" else e + 4.0
    return 4.0 * logits + head_in, transient * logits


def torchtitan_loss_bytes(cols: Columns, sweep: Sweep, e: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, transient) bytes per logit of torchtitan's loss, `cross_entropy(pred.float(), labels)`
    (torchtitan/components/loss.py), with the e-byte `pred` dropped before backward (train.py:
    `del pred`). Peaks counted tensor by tensor from the code that runs:

    - eager, no tensor parallel: forward pred + its fp32 copy + the fp32 log-softmax (e + 8);
      backward nll_loss_backward's dense fp32 gradient (zeros, then scattered) and
      log_softmax_backward's fp32 output beside the kept log-softmax: 12 bytes.
    - eager under loss parallel (tp > 1: torchtitan's default, `disable_loss_parallel` false;
      logits stay vocab-sharded): torch/distributed/tensor/parallel/loss.py runs log-softmax as
      `shifted = x - max; sum(exp(shifted)); shifted - logsumexp` (pred, x, shifted, exp: e + 12)
      and its backward as `(zeros_like(x) scattered + exp(x)) * grad` beside the kept x: 16 bytes.
    - compiled (torchtitan compiles the loss with the model since d1f62be, Feb 2025:
      `build_cross_entropy_loss`; it did from e10cb94, Oct 2024, until e8977b0, Dec 2024, and
      not in between: `memory.compiled_loss: false` says so): Inductor fuses the
      cast, log-softmax and its backward, so the graph keeps the e-byte pred (and per-token
      statistics) and writes one e-byte gradient: e + e. Only without tensor parallel: whether
      the DTensor loss-parallel handlers fuse under compile is not established, so tp > 1 keeps
      the eager count (an over-estimate at worst).
    """
    tp = cols["tp"] > 1
    compiled = cols["compile"].astype(bool) & ~tp & (sweep.memory.compiled_loss is not False)
    kept = np.where(compiled, float(e), 4.0)
    peak = np.select([compiled, tp], [2.0 * e, 16.0], default=12.0)
    return kept, peak - kept


def overhead_bytes(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Fixed per-process memory: the user's figure, else by device type and communicators."""
    if sweep.memory.overhead_gib is not None:
        return np.full(np.shape(cols["tp"]), sweep.memory.overhead_gib * GIB)
    if sweep.cluster.gpu.name == "cpu":
        return np.full(np.shape(cols["tp"]), CPU_BASE_GIB * GIB)
    comms = (cols["tp"] > 1).astype(int) + (cols["pp"] > 1) + (cols["dp"] > 1)
    return (CUDA_BASE_GIB + CUDA_PER_COMM_GIB * comms) * GIB


def state_bytes(cols: Columns, sweep: Sweep, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, grads, optimizer) bytes for `params` parameters on a rank, by sharding mode,
    as the sweep's recipe holds them (`builtin_state_bytes` or `recipe_state_bytes`)."""
    if sweep.memory.recipe in (None, "builtin", "torchtitan"):
        return builtin_state_bytes(cols, sweep, params)
    weights, grads, optimizer, _ = recipe_state_bytes(cols, sweep, params)
    return weights, grads, optimizer


def builtin_state_bytes(cols: Columns, sweep: Sweep, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The built-in trainer's (and torchtitan's) model states for `params` parameters on a rank.

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
    unit = _unit_params(cols, sweep)
    gathered = np.where(cols["pp"] > 1, params * e, 2 * unit * e)
    weights = np.where(fsdp, MASTER_BYTES * params / dp + gathered, (MASTER_BYTES + copy) * params)
    unsharded_grads = np.where(cols["pp"] > 1, GRAD_BYTES * params, unit * (e + 4))
    grads = np.where(fsdp, GRAD_BYTES * params / dp + unsharded_grads, GRAD_BYTES * params)
    optimizer = np.where(sharding == "none", ADAM_BYTES * params, ADAM_BYTES * params / dp)
    return weights, grads, optimizer


def _unit_params(cols: Columns, sweep: Sweep) -> np.ndarray:
    """The largest unit FSDP gathers at once: a block, or the embedding when it is larger."""
    return np.maximum(layer_params_per_rank(cols, sweep), sweep.model.vocab * sweep.model.hidden / cols["tp"])


def recipe_bytes(sweep: Sweep, sharding: str) -> StateBytes:
    """Bytes per parameter of each model state, and which are sharded over dp, for one value of
    the sharding knob in the sweep's recipe (megatron, deepspeed, explicit; README has the sources).

    megatron (--bf16): 2-byte parameters, main gradients 4 (fp32 accumulation, the default
    with --bf16) or 2 (--grad-reduce-in-bf16), fp32 master weights 4 and Adam moments 8;
    --use-distributed-optimizer shards master and moments (6 + 12/dp bytes); sharding fsdp is
    Megatron FSDP (optim_grads_params): everything sharded. deepspeed: 2 + 2 + 12 (ZeRO paper,
    K = 12); stage 1 shards the optimizer (master + moments), 2 also gradients, 3 parameters.
    Under fp32 compute there is no separate master copy: parameters are the fp32 weights.
    """
    m = sweep.memory
    e = compute_bytes(sweep)
    params, master = (2.0, 4.0) if e < 4 else (4.0, 0.0)
    if m.recipe == "explicit":
        assert m.bytes is not None  # checked by MemorySettings
        return m.bytes if sharding != "none" else m.bytes.model_copy(update={"sharded": []})
    if m.recipe == "megatron":
        grads = 2.0 if (m.grad_accum_dtype == "bf16" and e < 4) else 4.0  # default fp32 main grads
        distributed = sharding != "none" if m.distributed_optimizer is None else m.distributed_optimizer
        sharded = ["master", "optimizer"] if distributed else []
        if sharding == "fsdp":
            sharded = ["params", "grads", "master", "optimizer"]
        return StateBytes.model_validate(
            {"params": params, "grads": grads, "master": master, "optimizer": 8.0, "sharded": sharded}
        )
    if m.recipe == "deepspeed":
        grads = 4.0 if (m.grad_accum_dtype == "fp32" or e == 4) else 2.0  # default: the parameters' dtype
        stage = (
            {"none": 0, "zero1": 1, "fsdp": 3}[sharding]
            if (m.zero_stage is None or sharding == "none")
            else m.zero_stage
        )
        sharded = ["master", "optimizer", "grads", "params"][: {0: 0, 1: 2, 2: 3, 3: 4}[stage]]
        return StateBytes.model_validate(
            {"params": params, "grads": grads, "master": master, "optimizer": 8.0, "sharded": sharded}
        )
    raise ValueError(
        f"memory.recipe {m.recipe!r} has no byte table here (builtin and torchtitan use builtin_state_bytes)"
    )


def recipe_state_bytes(cols: Columns, sweep: Sweep, params: np.ndarray) -> tuple[np.ndarray, ...]:
    """(weights, grads, optimizer, buffers) for `params` parameters on a rank, from `recipe_bytes`.

    Sharded parameters are gathered a unit at a time: two units in 16 bits (the one computing,
    the one prefetched) and one unit's gradient before its reduce-scatter. DeepSpeed adds its
    gradient-reduction bucket (reduce_bucket_size elements) and, at stage 3, its prefetch bucket.
    """
    e = compute_bytes(sweep)
    dp = np.maximum(cols["dp"], 1).astype(float)
    unit = _unit_params(cols, sweep)
    out = [np.zeros(np.shape(params)) for _ in range(4)]
    for value in np.unique(cols["sharding"]):
        b = recipe_bytes(sweep, str(value))
        rows = cols["sharding"] == value

        def part(name: str, per_param: float, sharded: tuple[str, ...] = tuple(b.sharded)) -> np.ndarray:
            return per_param * params / np.where(name in sharded, dp, 1.0)

        gathered = np.where("params" in b.sharded, 2 * unit * e + unit * b.grads, 0.0)
        weights = part("params", b.params) + part("master", b.master) + gathered
        buffers = np.zeros(np.shape(params))
        if sweep.memory.recipe == "deepspeed" and b.sharded:
            buffers = np.minimum(params, DEEPSPEED_REDUCE_BUCKET) * b.grads
            if "params" in b.sharded:
                buffers = buffers + np.minimum(params, DEEPSPEED_PREFETCH_BUCKET) * e
        for i, term in enumerate((weights, part("grads", b.grads), part("optimizer", b.optimizer), buffers)):
            out[i] = np.where(rows, term, out[i])
    return tuple(out)


def p2p_bytes(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Pipeline send/receive buffers: one micro-batch's activation (s*b*h, /tp under sequence
    parallel) received forward and one gradient received backward, in compute precision."""
    e = compute_bytes(sweep)
    t = cols["tp"].astype(float)
    r = np.where(cols["sequence_parallel"].astype(bool) & (t > 1), 1.0 / t, 1.0)
    act = sweep.seq_len * cols["micro_batch_size"] * sweep.model.hidden * e * r
    return np.where(cols["pp"] > 1, 2.0 * act, 0.0)


def reserved_factor(sweep: Sweep) -> float:
    """reserved / allocated: the user's figure, else the recipe's (RESERVED_FACTOR)."""
    m = sweep.memory
    return m.reserved_factor if m.reserved_factor is not None else RESERVED_FACTOR.get(m.recipe or "builtin", 1.10)


def _state_and_buffers(cols: Columns, sweep: Sweep, params: np.ndarray) -> tuple[np.ndarray, ...]:
    if sweep.memory.recipe in (None, "builtin", "torchtitan"):
        return (*builtin_state_bytes(cols, sweep, params), np.zeros(np.shape(params)))
    return recipe_state_bytes(cols, sweep, params)


def recipe_activation_bytes(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """(kept, transient) of one block as the sweep's trainer checkpoints it, per micro-batch.

    The built-in trainer's terms (`layer_activation_bytes`), except torchtitan's `selective`:
    its op-level policy (torchtitan/models/llama3/infra/parallelize.py, `_apply_ac_to_transformer_block`,
    "Saves output of all compute ops, except every second mm") keeps the 1st, 3rd, 5th and 7th
    matmul of a SwiGLU block (wq, wv, w1, w2) and recomputes wk, wo and w3: e*(kv/t + h + ffn/t)
    bytes per token fewer kept, materialised again one block at a time in backward. Eager
    (no `compile`), that recomputation runs every op of the block the policy did not save
    (torch.utils.checkpoint's selective mode replays the block's forward in backward), so the
    block's whole unsaved activation exists at once, as under full checkpointing: the
    transient is the block's none-mode activation less what stays kept. Compiled, Inductor
    fuses the replayed elementwise ops (norms, SiLU, RoPE) and only the recomputed matmul
    outputs are materialised.
    """
    kept, transient = layer_activation_bytes(cols, sweep)
    m = sweep.model
    if sweep.memory.recipe != "torchtitan" or m.mlp != "swiglu":
        return kept, transient
    e = compute_bytes(sweep)
    t = cols["tp"].astype(float)
    tokens = sweep.seq_len * cols["micro_batch_size"]
    recomputed = e * (m.kv_dim / t + m.hidden + m.ffn / t) * tokens
    selective = cols["activation_checkpointing"] == "selective"
    p = _per_token_terms(cols, sweep)
    kept_tt = kept - recomputed
    replay = np.where(
        cols["compile"].astype(bool), transient + recomputed, (p["attention"] + p["mlp"]) * tokens - kept_tt
    )
    return np.where(selective, kept_tt, kept), np.where(selective, replay, transient)


def _ranks_to_check(pp: int, chunks: int) -> list[int]:
    """Pipeline ranks that can be the most loaded. Without interleaving, the middle ranks hold
    no embedding and no head, rank 1 has the most micro-batches in flight among them and gets
    an extra layer first (`split_layers` fills the middle first), so it bounds ranks 2..pp-2;
    with interleaving every rank is checked."""
    if chunks > 1:
        return list(range(pp))
    return sorted({0, min(1, pp - 1), pp - 1})


def estimate(cols: Columns, sweep: Sweep, *, rank: int | None = None) -> Estimate:
    """Peak memory per GPU for every layout in `cols` (derived columns included).

    `rank`: estimate that pipeline rank only (-1: the last, where Megatron-LM's logging rank
    sits) instead of the most loaded one.

    Every pipeline rank is estimated (its layers from `stage_layers`, the embedding on the
    first, the head and the logits on the last, its micro-batches in flight) and the one with
    the largest total reported, with its index in `Estimate.stage`.
    """
    kept, transient = recipe_activation_bytes(cols, sweep)
    logit_kept, logit_transient = logits_bytes(cols, sweep)
    n = len(cols["tp"])
    names = ("weights", "grads", "optimizer", "activations", "logits", "buffers")
    best = {k: np.zeros(n) for k in names}
    best_total = np.full(n, -np.inf)
    stage = np.zeros(n, dtype=np.int64)
    p2p = p2p_bytes(cols, sweep)
    for pp_value, chunks in pipeline_shapes(cols):
        rows = np.flatnonzero((cols["pp"] == pp_value) & (cols["chunks"] == chunks))
        sub = {k: v[rows] for k, v in cols.items()}
        layers = stage_layers(sweep.model.layers, pp_value, chunks) if pp_value <= sweep.model.layers else ()
        for r in _ranks_to_check(pp_value, chunks) if rank is None else [rank % pp_value]:
            count = layers[r]
            first, last = r == 0, r == pp_value - 1
            params = stage_params_at(sub, sweep, float(count), first=first, last=last)
            weights, grads, optimizer, buffers = _state_and_buffers(sub, sweep, params)
            inflight = microbatches_in_flight_at(sub, r)
            terms = {
                "weights": weights,
                "grads": grads,
                "optimizer": optimizer,
                "activations": inflight * count * kept[rows] + transient[rows],
                # the head runs in the last model chunk only: one micro-batch's logits kept under
                # the 1F1B schedules (interleaved included), every micro-batch's under GPipe
                "logits": (
                    np.where(sub["pp_schedule"] == "gpipe", np.maximum(sub["grad_accum"], 1), 1.0) * logit_kept[rows]
                    if pp_value > 1
                    else logit_kept[rows]
                )
                + logit_transient[rows]
                if last
                else np.zeros(len(rows)),
                "buffers": buffers + p2p[rows],
            }
            total = sum(terms.values())
            better = total > best_total[rows]
            idx = rows[better]
            for k in names:
                best[k][idx] = terms[k][better]
            best_total[idx] = total[better]
            stage[idx] = r
    allocated = sum(best.values())
    capacity = sweep.cluster.gpu.memory_gib * GIB * (1 - sweep.memory.headroom)
    return Estimate(
        best["weights"],
        best["grads"],
        best["optimizer"],
        best["activations"],
        best["logits"],
        best["buffers"],
        np.asarray(allocated * (reserved_factor(sweep) - 1.0)),
        overhead_bytes(cols, sweep),
        capacity,
        recipe=sweep.memory.recipe or "builtin",
        stage=stage,
    )
