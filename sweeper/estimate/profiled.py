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

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike

from sweeper.estimate.dp_wrappers import wrapper_overhead
from sweeper.estimate.flops import model_flops_per_token
from sweeper.estimate.memory import compute_bytes
from sweeper.estimate.moe import reduction_groups
from sweeper.estimate.shapes import BLOCK_KNOBS, TINY_ROWS
from sweeper.estimate.spans import collective_by_span, span
from sweeper.estimate.step_time import (
    COMM_PARTS,
    COMPUTE_PARTS,
    FLOAT8_SPEEDUP,
    FSDP_OVERLAP,
    Calibration,
    StepTime,
    busiest_stage_layers,
    predict_table,
)
from sweeper.layouts.stages import pipeline_shapes, stage_layers
from sweeper.profiles.lookup import Lookup, MeasuredProfile
from sweeper.profiles.profile import Profile, host_costs
from sweeper.spec.traits import TimeTraits

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.models import ModelShape
    from sweeper.spec.sweep import Sweep

DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb: one all-reduce per 25 MiB of gradients
# parameter tensors of the built-in trainer's block (wq, wk, wv, wo, w1, w2, w3 and two norms) and of a
# stage's ends (the embedding, or the final norm and the head): ZeRO-1 broadcasts each one apart
BLOCK_TENSORS = 9
END_TENSORS = 2


@dataclass(frozen=True)
class Block:
    """Per-layout seconds of one block for one micro-batch on one rank, forward and backward apart."""

    gemm_fwd: np.ndarray
    gemm_bwd: np.ndarray
    mlp_gemm_fwd: np.ndarray
    attn_fwd: np.ndarray
    attn_bwd: np.ndarray
    elem_fwd: np.ndarray
    elem_bwd: np.ndarray
    mlp_elem_fwd: np.ndarray

    def recompute(self, mode: np.ndarray) -> np.ndarray:
        """What backward runs again: the whole forward (full), the memory-bound forward the
        selective policy does not save (it keeps GEMM and attention outputs), the MLP's (ffn)."""
        full = self.gemm_fwd + np.nan_to_num(self.attn_fwd) + self.elem_fwd
        ffn = self.mlp_gemm_fwd + self.mlp_elem_fwd
        return np.select([mode == "full", mode == "selective", mode == "ffn"], [full, self.elem_fwd, ffn], 0.0)

    def total(self) -> np.ndarray:
        attention = np.nan_to_num(self.attn_fwd + self.attn_bwd)
        return self.gemm_fwd + self.gemm_bwd + attention + self.elem_fwd + self.elem_bwd


def predict_measured(
    measured: MeasuredProfile, cols: Columns, sweep: Sweep, calibration: Calibration, traits: TimeTraits
) -> StepTime:
    """The step priced from the cluster's measured profile (`Cluster.profile`): the table model's
    parts where the profile has no GEMM curves or the model is a mixture of experts, else `price`."""
    table = predict_table(cols, sweep, Calibration(), traits)
    if sweep.model.is_moe or not measured.lookup.gemm_curves:
        return StepTime(table.compute, table.comm, calibration, table.mfu, table.parts)
    return price(cols, sweep, measured.lookup, table, calibration, traits)


def gemm_dtype(lookup: Lookup, precision: str) -> str:
    """The profile's GEMM table for a run in `precision` (bf16, fp32), or the one it has."""
    return precision if lookup.has_gemm(precision) else next(iter(lookup.gemm_curves))[0]


def block_prices(
    lookup: Lookup, m: ModelShape, *, rows: np.ndarray, tp: np.ndarray, sp: np.ndarray, cols: Columns, dtype: str
) -> Block:
    """One block's GEMMs, attention and memory-bound work per layout (rows = tokens per micro-batch)."""
    h, q, kv = m.hidden, m.q_dim / tp, m.kv_dim / tp
    ffn = np.maximum(m.ffn // tp, 1)
    fp8 = cols["float8"].astype(bool) & lookup.has_gemm("fp8")

    def gemm(n: ArrayLike, k: ArrayLike, part: str) -> np.ndarray:
        t = lookup.gemm_s(dtype, rows, n, k, part=part)
        if lookup.has_gemm("fp8"):
            t = np.where(fp8, lookup.gemm_s("fp8", rows, n, k, part=part), t)
        return np.where(cols["float8"].astype(bool) & ~fp8, t / FLOAT8_SPEEDUP, t)

    up = 2 if m.mlp == "swiglu" else 1
    attn_proj = {p: gemm(q, h, p) + 2 * gemm(kv, h, p) + gemm(h, q, p) for p in ("fwd", "bwd")}
    mlp = {p: up * gemm(ffn, h, p) + gemm(h, ffn, p) for p in ("fwd", "bwd")}
    attn_fwd, attn_bwd = attention_prices(lookup, m, cols, rows=rows, tp=tp)
    compiled = cols["compile"].astype(bool)

    def elem(op: str, mode: str, elements: np.ndarray, part: str) -> np.ndarray:
        eager = lookup.elementwise_s(op, mode, elements, part=part)
        return (
            np.where(compiled, lookup.elementwise_s(op, "compiled", elements, part=part), eager)
            if mode == "eager"
            else eager
        )

    norm = "layernorm" if m.norm == "layernorm" else "rmsnorm"
    fused = cols["rmsnorm"] == "fused"
    seq_rows = np.where(sp & (tp > 1), rows / tp, rows)
    out = {}
    for p in ("fwd", "bwd"):
        norms = 2 * np.where(fused, elem(norm, "fused", seq_rows * h, p), elem(norm, "eager", seq_rows * h, p))
        adds = 2 * elem("add", "eager", seq_rows * h, p)
        act = elem("gelu" if m.mlp == "gelu" else "swiglu", "eager", rows * ffn, p)
        rope = elem("rope", "eager", rows * (q + kv), p) if m.position == "rope" else np.zeros(len(tp))
        out[p] = (norms, adds, act, rope)
    norms_f, adds_f, act_f, rope_f = out["fwd"]
    return Block(
        gemm_fwd=attn_proj["fwd"] + mlp["fwd"],
        gemm_bwd=attn_proj["bwd"] + mlp["bwd"],
        mlp_gemm_fwd=mlp["fwd"],
        attn_fwd=attn_fwd,
        attn_bwd=attn_bwd,
        elem_fwd=norms_f + adds_f + act_f + rope_f,
        elem_bwd=np.sum(out["bwd"], axis=0),
        mlp_elem_fwd=norms_f / 2 + act_f,
    )


def attention_prices(
    lookup: Lookup, m: ModelShape, cols: Columns, *, rows: np.ndarray, tp: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Attention's forward and backward per block and micro-batch: each kernel as measured at the
    layout's shape; NaN where the profile has no such kernel (the table prices those rows)."""
    n = len(tp)
    fwd, bwd = np.full(n, np.nan), np.full(n, np.nan)
    seq = rows / np.maximum(cols["micro_batch_size"], 1)
    for kernel in np.unique(cols["attention"]):
        if not lookup.has_attention(str(kernel)):
            continue
        at = cols["attention"] == kernel
        args = (
            cols["micro_batch_size"][at],
            m.heads // tp[at],
            np.maximum(m.kv_heads // tp[at], 1),
            m.head_dim,
            seq[at],
        )
        fwd[at] = lookup.attention_s(str(kernel), *args, part="fwd")
        bwd[at] = lookup.attention_s(str(kernel), *args, part="bwd")
    return fwd, bwd


def host_overhead(lookup: Lookup, m: ModelShape, cols: Columns, *, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The block's host overhead per micro-batch (launches, Python, autograd) and checkpointing's own:
    each measured tiny block less its priced operations at that shape, base plus each knob's change."""
    n = len(cols["tp"])
    base_s = lookup.block_s("base", "base")
    if base_s is None:
        return np.zeros(n), np.zeros(n)
    settings = lookup.profile.block_base

    def residual(knob: str, value: str) -> float:
        s = dict(settings) | ({knob: value} if knob != "base" else {})
        one = {k: np.array([_typed(k, s.get(k, "false"))]) for k in BLOCK_KNOBS}
        one |= {"micro_batch_size": np.array([1]), "float8": np.array([False]), "tp": np.array([1])}
        tiny = block_prices(
            lookup,
            m,
            rows=np.array([float(TINY_ROWS)]),
            tp=np.array([1.0]),
            sp=np.array([False]),
            cols=one,
            dtype=dtype,
        )
        priced = tiny.total() + tiny.recompute(one["activation_checkpointing"])
        measured = lookup.block_s(knob, value)
        return float(measured - priced[0]) if measured is not None else 0.0

    base = max(residual("base", "base"), 0.0)
    framework, recompute = np.full(n, base), np.zeros(n)
    for knob in BLOCK_KNOBS:
        for value in np.unique(cols[knob]):
            text = _text(value)
            if lookup.block_s(knob, text) is None:
                continue
            delta = residual(knob, text) - base
            target = recompute if knob == "activation_checkpointing" else framework
            target += np.where(cols[knob] == value, delta, 0.0)
    return np.maximum(framework, 0.0), np.maximum(recompute, 0.0)


def host_block_s(lookup: Lookup, cols: Columns) -> np.ndarray:
    """The host's time per block and micro-batch as the tiny block measured it: the base, plus each
    knob value's measured difference."""
    base = lookup.block_s("base", "base") or 0.0
    out = np.full(len(cols["tp"]), base)
    for knob in BLOCK_KNOBS:
        for value in np.unique(cols[knob]):
            measured = lookup.block_s(knob, _text(value))
            if measured is not None:
                out += np.where(cols[knob] == value, measured - base, 0.0)
    return out


def tp_overhead(lookup: Lookup, m: ModelShape, cols: Columns, *, dtype: str) -> np.ndarray:
    """What tensor parallelism adds to the block's host overhead per micro-batch (DTensor's dispatch,
    the plan's hooks): the tiny block split over the profile's ranks (knob tp, or tp_sp with sequence
    parallelism) less the tiny block alone and its collectives at that size (priced in tp_comm)."""
    tp = cols["tp"].astype(float)
    out = np.zeros(len(tp))
    base = lookup.block_s("base", "base")
    if base is None:
        return out
    for knob, sp in (("tp", False), ("tp_sp", True)):
        sizes = sorted(int(b.value) for b in lookup.profile.block if b.knob == knob)
        for size in sizes:
            point = lookup.blocks[(knob, str(size))]
            nearest = np.abs(tp - size) == np.min([np.abs(tp - x) for x in sizes], axis=0)
            rows = (tp > 1) & nearest & (cols["effective_sp"].astype(bool) == sp)
            tiny_bytes = point.rows * m.hidden * (2 if dtype == "bf16" else 4)
            comm = tp_block_comm(lookup, np.array([float(size)]), np.array([float(tiny_bytes)]), np.array([sp]))
            out[rows] = max(point.seconds - base - float(np.nan_to_num(comm)[0]), 0.0)
    return out


def tp_block_comm(lookup: Lookup, tp: np.ndarray, act_bytes: np.ndarray, sp: np.ndarray) -> np.ndarray:
    """One block's tensor-parallel collectives, forward and backward, at the measured bandwidths: two
    all-reduces each way without sequence parallelism, two all-gathers and two reduce-scatters with it
    (NaN where the profile has no collective measured)."""
    if not lookup.has_collective("all_reduce", "intra"):
        return np.full(len(tp), np.nan)
    ar = lookup.collective_s("all_reduce", "intra", tp, act_bytes)
    if lookup.has_collective("all_gather", "intra") and lookup.has_collective("reduce_scatter", "intra"):
        gather = lookup.collective_s("all_gather", "intra", tp, act_bytes)
        sp_block = 2 * (gather + lookup.collective_s("reduce_scatter", "intra", tp, act_bytes))
    else:
        sp_block = 2 * ar
    return np.where(tp > 1, np.where(sp, sp_block, 2 * ar), 0.0)


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, (bool, np.bool_)) else str(value)


def _typed(knob: str, text: str) -> object:
    return text == "true" if knob == "compile" else text


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


def idle_costs(profile: Profile, world: int) -> float:
    """1 where a pipeline stage's idle time is lost; 0 where the nodes are namespaces of one machine
    with more ranks than cores: there a waiting stage gives its core to the others, whose work (priced
    at the profile's contention) then goes faster by as much, so the bubble costs no time."""
    return 0.0 if profile.shared_host and world > profile.cpus else 1.0


def oversubscription(profile: Profile, processes: int) -> float:
    """On a CPU node: how much slower each process computes when more processes share its cores than
    the profile was measured for (each trial process takes cores / processes threads, at least one)."""
    if profile.gpu != "cpu":
        return 1.0

    def load(n: int) -> float:
        return max(1.0, n * max(1, profile.cpus // n) / profile.cpus)

    return load(processes) / load(profile.processes)


def core_share(
    profile: Profile, cols: Columns, layers: int, ranks: tuple[int, int], *, block_s: np.ndarray, end_s: np.ndarray
) -> np.ndarray:
    """Where one host's ranks outnumber its cores (CPU ranks, bound one core each, round-robin, by the
    local launcher: `sweeper.launchers.ranks.core_of`, rank r on core r mod cores): the busiest core's work over the busiest rank's as priced. Every part was measured
    with all ranks working at once, so a rank's price already holds its share of a crowded core; but a
    core whose other ranks hold lighter pipeline stages gives the busiest one more of its time (pp=4
    on 2 cores: the last stage, a block and the head, shares its core with a stage of one block).
    `ranks`: (the world, the ranks of one host); `block_s`: a block's seconds a micro-batch; `end_s`:
    the head's and the loss's (the last stage). 1 where each rank has a core, and for layouts whose
    ranks all carry the same work."""
    world, host_ranks = ranks
    share = np.ones(len(cols["pp"]))
    if profile.gpu != "cpu" or host_ranks <= profile.cpus:
        return share
    cores = profile.cpus
    for pp_value, chunks in pipeline_shapes(cols):
        if pp_value == 1 or pp_value > layers:
            continue
        rows = (cols["pp"] == pp_value) & (cols["chunks"] == chunks)
        held = np.array(stage_layers(layers, pp_value, chunks), dtype=float)
        work = held[:, None] * block_s[rows][None, :]  # (stage, layout)
        work[-1] += end_s[rows]
        # the mesh's pp dimension is outermost: each stage's ranks are world / pp adjacent ones
        stage_of = np.arange(world) * pp_value // world
        busiest = np.zeros(int(rows.sum()))
        for first in range(0, world, host_ranks):  # each host, its ranks bound from core 0
            load = np.zeros((cores, len(busiest)))
            for local in range(host_ranks):
                load[local % cores] += work[stage_of[first + local]]
            busiest = np.maximum(busiest, load.max(axis=0))
        share[rows] = busiest / (host_ranks / cores * work.max(axis=0))
    return share


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
        lookup.inter_s("send_recv", senders, 2 * senders, message)
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
