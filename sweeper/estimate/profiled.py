"""The step-time model priced from a measured profile of the machine (`sweep profile`). Pure.

The same parts as `sweeper.estimate.step_time` (PARTS), each from measured seconds where the profile has
them: the block's GEMMs by shape (and the vocabulary head's), attention per kernel and shape,
memory-bound work (norms, RoPE, the activation, residual adds, the loss over the vocabulary, the
optimizer step) per element count eager or compiled, the host's overhead per block (the tiny
block's measured time less its priced operations at that shape, per knob value), recomputation
(full: the block's forward again; selective: its memory-bound forward, what the trainer's policy
does not save; ffn: the MLP's forward), and the tensor-parallel, pipeline and data-parallel
collectives at the bus bandwidth measured at their message size. What the profile does not hold
(a kernel it could not run, a context-parallel or mixture-of-experts layout, collectives measured
on one GPU) keeps the GPU table's price for that part, so every layout has one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.dp_wrappers import wrapper_overhead
from sweeper.estimate.flops import model_flops_per_token
from sweeper.estimate.host import core_share, host_block_s, host_overhead, idle_costs, oversubscription, tp_overhead
from sweeper.estimate.memory import compute_bytes
from sweeper.estimate.moe import reduction_groups
from sweeper.estimate.profiled_work import block_prices, gemm_dtype, tp_block_comm
from sweeper.estimate.spans import collective_by_span, span
from sweeper.estimate.step_time import (
    COMM_PARTS,
    COMPUTE_PARTS,
    FSDP_OVERLAP,
    Calibration,
    StepTime,
    busiest_stage_layers,
    predict_table,
)
from sweeper.profiles.lookup import Lookup, MeasuredProfile
from sweeper.profiles.profile import host_costs
from sweeper.spec.traits import TimeTraits

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep

DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb: one all-reduce per 25 MiB of gradients
# parameter tensors of the built-in trainer's block (wq, wk, wv, wo, w1, w2, w3 and two norms) and of a
# stage's ends (the embedding, or the final norm and the head): ZeRO-1 broadcasts each one apart
BLOCK_TENSORS = 9
END_TENSORS = 2


def predict_measured(
    measured: MeasuredProfile, cols: Columns, sweep: Sweep, calibration: Calibration, traits: TimeTraits
) -> StepTime:
    """The step priced from the cluster's measured profile (`Cluster.profile`): the table model's
    parts where the profile has no GEMM curves or the model is a mixture of experts, else `price`."""
    table = predict_table(cols, sweep, Calibration(), traits)
    if sweep.model.is_moe or not measured.lookup.gemm_curves:
        return StepTime(table.compute, table.comm, calibration, table.mfu, table.parts)
    return price(cols, sweep, measured.lookup, table, calibration, traits)


def price(
    cols: Columns, sweep: Sweep, lookup: Lookup, table: StepTime, calibration: Calibration, traits: TimeTraits
) -> StepTime:
    """Every part of the step from the profile (see the module's docstring), the table's where it has none."""
    m, cl, s = sweep.model, sweep.cluster, sweep.seq_len
    tp, pp, cp = (cols[k].astype(float) for k in ("tp", "pp", "cp"))
    mbs, accum = cols["micro_batch_size"].astype(float), np.maximum(cols["grad_accum"], 1).astype(float)
    rows = mbs * s / cp
    sp = cols["effective_sp"].astype(bool)
    mode = cols["activation_checkpointing"]
    dtype = gemm_dtype(lookup, sweep.trial.precision)
    busiest = busiest_stage_layers(cols, m.layers)
    passes = busiest * accum  # block passes the busiest rank runs per step
    blk = block_prices(lookup, m, rows=rows, tp=tp, sp=sp, cols=cols, dtype=dtype)
    # nodes that are namespaces of the profile's one machine share its cores: every rank counts
    host_ranks = cl.world if lookup.profile.shared_host else cl.gpus_per_node
    vocab = np.maximum(m.vocab // tp, 1)
    head = lookup.gemm_s(dtype, rows, vocab, m.hidden, part="fwd") + lookup.gemm_s(
        dtype, rows, vocab, m.hidden, part="bwd"
    )
    loss = lookup.elementwise_s("cross_entropy", "eager", rows * vocab)
    if lookup.profile.gpu == "cpu":  # the host computes too: its overhead adds to the arithmetic
        overhead, ac_overhead = host_overhead(lookup, m, cols, dtype=dtype)
    else:  # a GPU computes while the host launches: the host shows only where it takes longer
        overhead = np.maximum(host_block_s(lookup, cols) - np.nan_to_num(blk.total() + blk.recompute(mode)), 0.0)
        ac_overhead = np.zeros(len(tp))
    overhead = overhead + tp_overhead(lookup, m, cols, dtype=dtype)
    per_step, per_pass = host_costs(lookup.profile.reference_steps)
    block_s = np.nan_to_num(blk.total() + blk.recompute(mode)) + overhead + ac_overhead + per_pass
    share = core_share(lookup.profile, cols, m.layers, (cl.world, host_ranks), block_s=block_s, end_s=head + loss)
    crowd = oversubscription(lookup.profile, host_ranks)
    slow = crowd * share
    t = table.parts
    matmul = (passes * (blk.gemm_fwd + blk.gemm_bwd) + accum * head) * slow
    attention = np.where(
        np.isnan(blk.attn_fwd) | (cp > 1), t["attention"], passes * (blk.attn_fwd + blk.attn_bwd) * slow
    )
    memory_bound = (passes * (blk.elem_fwd + blk.elem_bwd) + accum * loss) * slow
    framework = passes * (overhead * slow + per_pass * share) + traits.microbatch_s * accum
    if lookup.profile.gpu == "cpu":  # FSDP2's hooks and copies (on a GPU they run while the kernels do)
        framework = framework + wrapper_overhead(lookup, cols, m.layers, traits) * slow
    recompute = passes * (blk.recompute(mode) + ac_overhead) * slow
    optimizer = optimizer_s(lookup, cols, sweep) * crowd  # every rank steps its own at once
    work = matmul + t["expert_matmul"] + attention + memory_bound + framework + recompute
    bubble_share = np.where(pp > 1, (pp - 1) / cols["chunks"].astype(float) / accum, 0.0)
    parts = dict(t)
    parts |= {
        "matmul": matmul,
        "attention": attention,
        "memory_bound": memory_bound,
        "framework": framework + per_step,  # once a step: not work a pipeline bubble idles beside
        "recompute": recompute,
        "bubble": work * bubble_share * idle_costs(lookup.profile, cl.world),
        "optimizer": optimizer,
    }
    parts |= collectives(cols, sweep, lookup, table, work=work, bubble_share=bubble_share, traits=traits)
    compute = sum(parts[k] for k in COMPUTE_PARTS)
    comm = sum(parts[k] for k in COMM_PARTS)
    step = calibration.compute_scale * compute + calibration.comm_scale * comm
    peak = cl.gpu.peak_flops(sweep.trial.precision)
    mfu = model_flops_per_token(m, s) * sweep.global_batch_size * s / (step * cl.world * peak)
    return StepTime(np.asarray(compute), np.asarray(comm), calibration, np.asarray(mfu), parts)


def optimizer_s(lookup: Lookup, cols: Columns, sweep: Sweep) -> np.ndarray:
    """The optimizer step over the busiest rank's parameters (sharded by ZeRO-1 and FSDP)."""
    groups = reduction_groups(cols, sweep)
    sharded = cols["sharding"] != "none"
    params = sum(p / np.where(sharded, np.maximum(n, 1), 1.0) for p, n, _ in groups)
    mode = "fused" if lookup.has_elementwise("adamw", "fused") else "eager"
    return lookup.elementwise_s("adamw", mode, np.maximum(params, 1.0), part="fwd")


def collectives(
    cols: Columns,
    sweep: Sweep,
    lookup: Lookup,
    table: StepTime,
    *,
    work: np.ndarray,
    bubble_share: np.ndarray,
    traits: TimeTraits,
) -> dict[str, np.ndarray]:
    """Tensor-parallel, pipeline and data-parallel communication, each collective priced by the nodes
    it spans (`sweeper.estimate.spans`: the node's table, the link as measured across two nodes, the
    fitted ring beyond); the table's price where the profile measured nothing for it."""
    t = table.parts
    m, gpn = sweep.model, sweep.cluster.gpus_per_node
    tp, pp, dp = (cols[k].astype(float) for k in ("tp", "pp", "dp"))
    accum = np.maximum(cols["grad_accum"], 1).astype(float)
    e = compute_bytes(sweep)
    full = cols["activation_checkpointing"] == "full"
    sp = cols["effective_sp"].astype(bool)
    act_bytes = cols["micro_batch_size"] * sweep.seq_len / cols["cp"] * m.hidden * e
    passes = busiest_stage_layers(cols, m.layers) * accum
    out: dict[str, np.ndarray] = {}
    if lookup.has_collective("all_reduce", "intra"):  # tp stays inside a node (the layout rules)
        per_block = tp_block_comm(lookup, tp, act_bytes, sp) * np.where(full, 1.5, 1.0)
        out["tp_comm"] = np.where(tp <= gpn, per_block * passes * (1 + bubble_share), t["tp_comm"])
    out["pp_comm"] = pp_comm(lookup, cols, gpn, np.asarray(act_bytes / np.where(sp, tp, 1.0)), t["pp_comm"])
    raw = dp_raw(lookup, cols, sweep, accum, traits)
    usable = ~np.isnan(raw)
    last_backward = (2.0 / 3.0) * work / accum
    # on a CPU node gloo reduces on the cores the backward computes on: nothing hides
    overlap = 0.0 if lookup.profile.gpu == "cpu" else traits.dp_overlap
    exposed = np.maximum(raw - overlap * last_backward, 0.0)
    fsdp = cols["sharding"] == "fsdp"
    if lookup.profile.gpu != "cpu":  # FSDP's prefetch hides what the table says it hides
        exposed = np.where(fsdp, np.maximum(raw - FSDP_OVERLAP * work, 0.1 * raw), exposed)
    out["dp_comm"] = np.where(usable, exposed, t["dp_comm"])
    out["dp_hidden"] = np.where(usable, np.maximum(np.nan_to_num(raw) - exposed, 0.0), t["dp_hidden"])
    return out


def pp_comm(lookup: Lookup, cols: Columns, gpn: int, message: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Pipeline sends on the busiest path: each stage boundary inside a node at the node's send/recv,
    each one across the link at the send/recv measured with as many of the node's ranks sending at once
    (a stage's ranks all send their activations together). The table's where either is missing."""
    pp = cols["pp"].astype(float)
    accum = np.maximum(cols["grad_accum"], 1).astype(float)
    chunks = cols["chunks"].astype(float)
    sends = 2 * accum * chunks + 2 * (pp - 1) * chunks
    stage_span = (cols["tp"] * cols["cp"] * cols["dp"]).astype(float)
    nodes, _ = span(pp, stage_span, gpn)
    crossings = np.minimum(nodes - 1, pp - 1)
    n = len(pp)
    inside = (
        lookup.collective_s("send_recv", "intra", np.full(n, 2.0), message)
        if lookup.has_collective("send_recv", "intra")
        else np.full(n, np.nan)
    )
    senders = np.minimum(stage_span, gpn)
    across = (
        lookup.inter_s("send_recv", senders, 2 * senders, message, node_ranks=gpn)
        if lookup.has_collective("send_recv", "inter")
        else np.full(n, np.nan)
    )
    inside = np.where(crossings >= pp - 1, 0.0, inside)  # every boundary crosses: the node's price unused
    across = np.where(crossings == 0, 0.0, across)
    one = (crossings * across + (pp - 1 - crossings) * inside) / np.maximum(pp - 1, 1)
    return np.where((pp > 1) & ~np.isnan(one), sends * np.nan_to_num(one), np.where(pp > 1, table, 0.0))


def dp_raw(lookup: Lookup, cols: Columns, sweep: Sweep, accum: np.ndarray, traits: TimeTraits) -> np.ndarray:
    """The data-parallel traffic of a step, each collective by its span (NaN: not measured). Plain:
    the gradients' fp32 all-reduce in DDP's 25 MiB buckets (per micro-batch where the trainer syncs
    each one under a pipeline); ZeRO-1: that, then the updated shards gathered back: one broadcast per
    parameter tensor where the trainer sends them so (`TimeTraits.zero1_broadcasts`) and the profile
    measured broadcasts, else one all-gather; FSDP: per block, its parameters all-gathered for forward
    and again for backward and its gradients reduce-scattered, per micro-batch (once per step under a
    pipeline, whose stages keep them gathered)."""
    gpn = sweep.cluster.gpus_per_node
    sharding = cols["sharding"]
    pp = cols["pp"].astype(float)
    per_mb = (sharding == "none") & (pp > 1) & traits.grad_sync_per_microbatch_pp
    layers = busiest_stage_layers(cols, sweep.model.layers)
    blocks = layers + 1.0  # and the embedding or the head
    tensors = layers * BLOCK_TENSORS + END_TENSORS
    raw = np.zeros(len(pp))
    for params, ranks, stride in reduction_groups(cols, sweep):
        grads = params * 4.0
        buckets = np.maximum(np.ceil(grads / DDP_BUCKET_BYTES), 1.0)
        reduce = buckets * collective_by_span(lookup, "all_reduce", ranks, stride, grads / buckets, gpn)
        gather = collective_by_span(lookup, "all_gather", ranks, stride, grads, gpn)
        if traits.zero1_broadcasts:
            sent = tensors * collective_by_span(lookup, "broadcast", ranks, stride, grads / tensors, gpn)
            gather = np.where(np.isnan(sent), gather, sent)
        per_block = grads / blocks
        fsdp = blocks * (
            2 * collective_by_span(lookup, "all_gather", ranks, stride, per_block, gpn)
            + collective_by_span(lookup, "reduce_scatter", ranks, stride, per_block, gpn)
        )
        raw = raw + np.select(
            [sharding == "fsdp", sharding == "zero1"],
            [np.where(pp > 1, 1.0, accum) * fsdp, reduce + gather],
            np.where(per_mb, accum, 1.0) * reduce,
        )
    return raw
