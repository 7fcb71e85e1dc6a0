"""Analytic peak memory per GPU (the most loaded rank) for any layout, vectorised over layouts.

Activations start from Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", section 4: s*b*h*(34 + 5*a*s/h) bytes per GPT layer in 16-bit) and are
re-derived tensor by tensor for the block the built-in trainer runs: RMSNorm (no biases),
RoPE, grouped-query attention, SwiGLU, no dropout. Each term below names the tensors that
autograd keeps; tests/runtime check the sums against what the trainer really saves.

Model states follow the trainer the user runs (`memory.recipe`, `Recipe.states` in sweeper.trainers): what each
value of the `sharding` knob costs in that trainer. Around the tensors: transient buffers
(gradient-reduction buckets, pipeline send/receive buffers, gathered FSDP units) make the
allocated peak; the caching allocator's gap on top of it makes the reserved peak, which plus
the fixed per-process overhead is what must fit the card. Pipeline stages need not be even
(`sweeper.layouts.stages.split_layers`): every stage is estimated and the most loaded one reported.

Context parallel: a rank holds seq/cp tokens of every micro-batch (activations, logits, pipeline
buffers), plus its key/value exchange (`cp_exchange_terms`). Mixture of experts: a stage's
experts are split by ep and etp and their states sharded over expert data parallel, the rest
over dp*cp (`stage_state_bytes`); a sparse block keeps the router's scores, the routed token
copies with their expert MLP tensors and the combine's inputs, and passes the all-to-all
buffers (`moe_block_extra_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sweeper.knobs import KNOBS
from sweeper.layouts.stages import pipeline_shapes, stage_dense_layers, stage_layers, stage_param_groups_at
from sweeper.spec.hardware import GIB

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep

# Attention kernels that keep the s x s probabilities for backward, and how many bytes per
# score they keep: the softmax output in fp32 (softmax runs in fp32 under bf16 autocast, and
# in the eager kernel by construction) plus the 16-bit copy the second matmul saves.
SCORE_KERNELS = KNOBS["attention"].with_property("keeps_scores")

# Fixed per-process cost outside the tensors: CUDA context and kernels (~0.5-1 GiB), NCCL
# communicator buffers (~0.25 GiB per communicator); on CPU the interpreter, torch and gloo.
CUDA_BASE_GIB = 1.0
CUDA_PER_COMM_GIB = 0.25
CPU_BASE_GIB = 0.3

# Dropless routing (Megatron-LM's default: --moe-expert-capacity-factor None; torchtitan's MoE)
# bounds no expert's load, and the busiest expert-parallel rank receives more than its average
# share of the routed tokens. The estimate gives that rank 1.25 x its share: the capacity factor
# Switch Transformer trains with (Fedus et al. 2022, "Switch Transformers", section 2.2 and
# table 1, capacity factor 1.25), taken as the headroom the load-balancing loss leaves.
MOE_CAPACITY = 1.25

# Context-parallel exchange buffers of one block, in units of the local keys and values.
# Ring (Megatron-LM through Transformer Engine, torchtitan through PyTorch's ring attention): the
# backward of TE's AttnFuncWithCPAndKVP2P allocates two buffers each of the local K/V and its
# gradient (`p2p_comm_buffers = [torch.empty((2, *kv.shape)), ...]`, one being computed on, one in
# flight): 4 K/V-sized tensors at once, the forward's two K/V chunks (`kv_inputs = [None, None]`) fewer.
RING_KV_BUFFERS = 4

BREAKDOWN = ("weights", "grads", "optimizer", "activations", "logits", "buffers", "allocator", "overhead")


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
    recipe: str  # memory.recipe of the sweep
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


def local_tokens(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Tokens of one micro-batch a rank holds: context parallel splits the sequence over cp ranks."""
    return sweep.seq_len * cols["micro_batch_size"] / cols["cp"].astype(float)


def per_token_terms(cols: Columns, sweep: Sweep) -> dict[str, np.ndarray]:
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
    Checked against what the trainer saves (saved-tensor hooks) in tests/runtime.
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
    p = per_token_terms(cols, sweep)
    mode = cols["activation_checkpointing"]
    tokens = local_tokens(cols, sweep)
    cp_kept, cp_transient = cp_exchange_terms(cols, sweep)
    attention = p["attention"] + cp_kept
    none = attention + p["mlp"]
    kept = np.select(
        [mode == "none", mode == "full", mode == "ffn", mode == "selective"],
        [none, p["block_in"], attention + p["block_in"], p["selective"] + cp_kept],
        default=np.nan,
    )
    transient = np.select([mode == "full", mode == "ffn"], [none, p["mlp"]], default=0.0) + cp_transient
    return kept * tokens, transient * tokens


def cp_exchange_terms(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """(kept, transient) bytes per local token of one block's context-parallel key/value exchange.

    All-gather (the built-in trainer, sweeper/runtime/context.py): attention saves the gathered
    keys and values of the whole sequence, cp times the local ones (e*2*kv/t per local token,
    already counted once), and its backward forms their whole-sequence gradient before the
    reduce-scatter. Ring (the trainer's `TimeTraits.cp_ring`, one fact for its time and memory:
    Transformer Engine's p2p attention in Megatron-LM): the local K/V stay as without cp; the exchange
    holds RING_KV_BUFFERS K/V-sized buffers while a block's attention runs.
    """
    e = compute_bytes(sweep)
    cp = cols["cp"].astype(float)
    kv = 2 * e * sweep.model.kv_dim / cols["tp"].astype(float)
    if sweep.trainer.time.cp_ring:
        return np.zeros(np.shape(cp)), np.where(cp > 1, RING_KV_BUFFERS * kv, 0.0)
    return (cp - 1) * kv, np.where(cp > 1, cp * kv, 0.0)


def moe_block_extra_bytes(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """(kept, transient) bytes of one mixture-of-experts block beyond a dense block's, per micro-batch.

    Per local token, with r the share of tokens a rank routes (1/tp under sequence parallel,
    whose tokens stay split through the MoE layer in Megatron-LM), k the top-k, E experts, c =
    MOE_CAPACITY, f the expert width and m the MLP's tensors of width f (SwiGLU 4, GELU 2):
      router     the e-byte logits and their fp32 softmax (topk_softmax_with_capacity, moe_utils.py): r*(e+4)*E
      experts    the rank's routed copies, c*k*etp*r per local token (an all-to-all over ep, then
                 an all-gather over etp), each keeping its input e*h and m*e*f/etp of the MLP
      combine    the k expert outputs per token returned, kept to weight them by the router's probabilities
      shared     a shared expert as a dense MLP of width f split by tp, on the gathered input
    and the router's input e*h*r, minus the dense MLP's e*h + m*e*ffn/t (the norm is common). Transient: the all-to-all's
    send and receive buffers (k*r + c*k*etp*r tokens of e*h). Kept under none and selective
    (Megatron-LM's selective recompute covers core attention only), recomputed under full and ffn.
    """
    m = sweep.model
    e = compute_bytes(sweep)
    h, k, E, f = m.hidden, m.experts_per_token, m.experts, m.expert_ffn
    mlp_tensors = 2 if m.mlp == "gelu" else 4
    t, etp = cols["tp"].astype(float), cols["etp"].astype(float)
    r = np.where(cols["effective_sp"], 1.0 / t, 1.0)
    routed = MOE_CAPACITY * k * etp * r
    moe = r * (e + 4) * E + routed * (e * h + mlp_tensors * e * f / etp) + k * r * e * h
    # the block's input as the router and the dispatcher read it: the rank's own tokens (Megatron-LM
    # does not gather the sequence-parallel tokens for the MoE layer); a shared expert, a dense MLP,
    # reads them gathered
    shared = np.where(m.shared_experts > 0, e * h + m.shared_experts * mlp_tensors * e * f / t, 0.0)
    moe = moe + e * h * r + shared
    dense = e * h + mlp_tensors * e * m.ffn / t
    a2a = (k * r + routed) * e * h
    mode = cols["activation_checkpointing"]
    keeps = (mode == "none") | (mode == "selective")
    tokens = local_tokens(cols, sweep)
    kept = np.where(keeps, moe - dense, 0.0)
    transient = np.where(keeps, 0.0, np.maximum(moe - dense, 0.0)) + a2a
    return kept * tokens, transient * tokens


def microbatches_in_flight_at(cols: Columns, rank: int) -> np.ndarray:
    """Micro-batch x block activations pipeline rank `rank` holds, in units of its own layers.

    1F1B: rank i runs pp - i forwards before its first backward; GPipe's order (`gpipe_order`): every micro-batch;
    interleaved: rank i warms up (v-1)*pp + 2*(pp-1-i) chunks (torch ScheduleInterleaved1F1B,
    Megatron-LM's interleaved schedule) plus the one in its first steady step.
    """
    pp, m, v = cols["pp"], cols["grad_accum"], cols["chunks"].astype(float)
    one_f_one_b = np.minimum(pp - rank, m).astype(float)
    interleaved = np.minimum((v - 1) * pp + 2 * (pp - 1 - rank) + 1, m * v) / v
    return np.select([pp == 1, _gpipe(cols), v > 1], [1.0, m.astype(float), interleaved], default=one_f_one_b)


def _gpipe(cols: Columns) -> np.ndarray:
    """Rows whose pipeline runs GPipe's order (`layout.gpipe_order`; the schedule alone in columns without it)."""
    return cols["gpipe_order"] if "gpipe_order" in cols else cols["pp_schedule"] == "gpipe"


def logits_bytes(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """(kept per micro-batch, transient) bytes of the output layer on the last stage.

    Kept: the final norm (as a block's norm), the output projection's input (e*h, all of h
    even under sequence parallel), and what the loss keeps per logit (vocab split by tp under
    loss parallel); transient: what the loss and its gradient add while they are formed
    (`loss_bytes_per_logit`).
    """
    e = compute_bytes(sweep)
    t = cols["tp"].astype(float)
    r = np.where(cols["effective_sp"], 1.0 / t, 1.0)
    tokens = local_tokens(cols, sweep)
    logits = tokens * sweep.model.vocab / t
    head_in = tokens * (norm_bytes(cols, sweep, r) + e * sweep.model.hidden)
    loss_kept, loss_transient = loss_bytes_per_logit(cols, sweep)
    return loss_kept * logits + head_in, loss_transient * logits


def loss_bytes_per_logit(cols: Columns, sweep: Sweep) -> tuple[np.ndarray | float, np.ndarray | float]:
    """(kept, transient) bytes per logit of the loss: the recipe's (`Recipe.loss_bytes`; by default
    the fp32 log-softmax kept, and at the peak the e-byte logits and an fp32 gradient at once), or
    the kernel `memory.loss_kernel` names. fused (`LossKernel`): the e-byte logits kept as the
    kernel saved them, no fp32 copy, and an e-byte gradient in backward: e + e. Its fp32
    log-sum-exp (4 bytes per token, against e*vocab) is left out."""
    if sweep.memory.loss_kernel == "fused":
        e = float(compute_bytes(sweep))
        return e, e
    return sweep.memory_recipe.loss_bytes(cols, sweep)


def overhead_bytes(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Fixed per-process memory: the user's figure, else by device type and communicators."""
    if sweep.memory.overhead_gib is not None:
        return np.full(np.shape(cols["tp"]), sweep.memory.overhead_gib * GIB)
    if sweep.cluster.gpu.name == "cpu":
        return np.full(np.shape(cols["tp"]), CPU_BASE_GIB * GIB)
    comms = (cols["tp"] > 1).astype(int) + (cols["pp"] > 1) + (cols["dp"] > 1) + (cols["cp"] > 1)
    if sweep.model.is_moe:  # the expert-parallel and expert-data-parallel groups
        comms = comms + (cols["ep"] > 1) + (cols["edp"] > 1)
    return (CUDA_BASE_GIB + CUDA_PER_COMM_GIB * comms) * GIB


def p2p_bytes(cols: Columns, sweep: Sweep) -> np.ndarray:
    """Pipeline send/receive buffers: one micro-batch's activation (s*b*h, /tp under sequence
    parallel, /cp) received forward and one gradient received backward, in compute precision."""
    e = compute_bytes(sweep)
    t = cols["tp"].astype(float)
    r = np.where(cols["sequence_parallel"].astype(bool) & (t > 1), 1.0 / t, 1.0)
    act = local_tokens(cols, sweep) * sweep.model.hidden * e * r
    return np.where(cols["pp"] > 1, 2.0 * act, 0.0)


def reserved_factor(sweep: Sweep) -> float:
    """reserved / allocated: the user's figure, else the recipe's."""
    m = sweep.memory
    return m.reserved_factor if m.reserved_factor is not None else sweep.memory_recipe.reserved_factor


def state_bytes(cols: Columns, sweep: Sweep, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(weights, grads, optimizer) bytes for `params` parameters on a rank, by sharding mode,
    as the sweep's recipe holds them (`Recipe.states`, in sweeper.trainers)."""
    weights, grads, optimizer, _ = sweep.memory_recipe.states(cols, sweep, params)
    return weights, grads, optimizer


def stage_state_bytes(
    cols: Columns, sweep: Sweep, shared: np.ndarray, experts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(weights, grads, optimizer, buffers) of a rank holding `shared` non-expert and `experts`
    expert parameters, as the recipe shards them: the non-expert ones over dp*cp (Megatron-LM's
    distributed optimizer and torchtitan's FSDP shard over the data- and context-parallel ranks
    together: "CP ... 1/N optimizer states (with distributed optimizer)", moe/README.md), the
    expert ones over expert data parallel, edp = world/(etp*ep*pp), where their gradients are
    reduced (Megatron-LM's expert_data_parallel group). The recipe's states are affine in the
    parameters (a fixed gathered unit plus per-parameter bytes): the expert part adds only the
    per-parameter bytes."""
    recipe = sweep.memory_recipe
    out = recipe.states({**cols, "dp": cols["dp"] * cols["cp"]}, sweep, shared)
    if not sweep.model.is_moe:
        return out
    expert_cols = {**cols, "dp": cols["edp"]}
    with_experts = recipe.states(expert_cols, sweep, experts)
    without = recipe.states(expert_cols, sweep, np.zeros(np.shape(experts)))
    a, b, c, d = (x + y - z for x, y, z in zip(out, with_experts, without, strict=True))
    return a, b, c, d


def recipe_activation_bytes(cols: Columns, sweep: Sweep) -> tuple[np.ndarray, np.ndarray]:
    """(kept, transient) of one block as the sweep's trainer checkpoints it, per micro-batch:
    the built-in trainer's terms (`layer_activation_bytes`) as the recipe changes them
    (`Recipe.activations`: torchtitan's op-level selective policy)."""
    kept, transient = layer_activation_bytes(cols, sweep)
    return sweep.memory_recipe.activations(cols, sweep, kept, transient)


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
    moe_kept, moe_transient = moe_block_extra_bytes(cols, sweep) if sweep.model.is_moe else (0.0 * kept, 0.0 * kept)
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
        m = sweep.model
        layers = stage_layers(m.layers, pp_value, chunks) if pp_value <= m.layers else ()
        dense = stage_dense_layers(m.layers, m.dense_layers, pp_value, chunks) if m.is_moe else layers
        for r in _ranks_to_check(pp_value, chunks) if rank is None else [rank % pp_value]:
            count, sparse = layers[r], layers[r] - dense[r]
            first, last = r == 0, r == pp_value - 1
            shared, experts = stage_param_groups_at(sub, sweep, float(count), first=first, last=last, dense=dense[r])
            weights, grads, optimizer, buffers = stage_state_bytes(sub, sweep, shared, experts)
            inflight = microbatches_in_flight_at(sub, r)
            block_kept = count * kept[rows] + sparse * moe_kept[rows]
            block_transient = transient[rows] + (moe_transient[rows] if sparse else 0.0)
            terms = {
                "weights": weights,
                "grads": grads,
                "optimizer": optimizer,
                "activations": inflight * block_kept + block_transient,
                # the head runs in the last model chunk only: one micro-batch's logits kept under
                # the 1F1B schedules (interleaved included), every micro-batch's under GPipe
                "logits": (
                    np.where(_gpipe(sub), np.maximum(sub["grad_accum"], 1), 1.0) * logit_kept[rows]
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
        recipe=sweep.memory.recipe,
        stage=stage,
    )
