"""What `sweep profile` measures: the shapes a sweep's layouts produce, or a default set. Pure.

A sweep's shapes: for each tp of its space and each micro-batch size, the block's GEMMs (Q, K/V,
output and MLP projections, the vocabulary head) at micro-batch x sequence / cp rows, its attention
kernels at the per-rank heads, the memory-bound operations at those element counts, one block at
a tiny shape per value of the knobs that change its host overhead, and the collectives at the
message sizes of its tensor-parallel activations and data-parallel gradients.

Without a sweep file the default shapes are a LLaMA-3-style 1B and 8B at 2k and 4k tokens on a
GPU (`DEFAULT_GPU`), and the tiny CPU demo models at 64 to 256 tokens on a CPU (`DEFAULT_CPU`),
each at tp 1, 2, 4 and 8 (1 and 2 on a CPU) and micro-batch 1, 2, 4 and 8.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sweeper.spec.models import ModelShape

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

# what the measured block's knobs may take (the built-in trainer's values that change its ops)
BLOCK_KNOBS = ("attention", "rmsnorm", "activation_checkpointing", "compile")
TINY_ROWS = 16  # a block at 16 tokens: its host overhead, not its arithmetic
PROGRESS_MARK = "sweep-profile: "  # rank 0's progress lines in its log, which `sweep profile` follows


@dataclass(frozen=True)
class Workload:
    """One model at one sequence length, as the sweep (or the default set) trains it."""

    shape: ModelShape
    seq_len: int
    tps: tuple[int, ...]
    micro_batches: tuple[int, ...]
    cps: tuple[int, ...] = (1,)


@dataclass
class MeasurePlan:
    """Shapes to measure, deduplicated; `sweeper.runtime.profiling` measures them."""

    gemm: set[tuple[int, int, int]] = field(default_factory=set)  # (m, n, k)
    attention: set[tuple[int, int, int, int, int]] = field(default_factory=set)  # (batch, heads, kv, head_dim, seq)
    elementwise: set[tuple[str, int, int]] = field(default_factory=set)  # (op, rows, width); adamw: (op, params, 1)
    kernels: tuple[str, ...] = ()
    norms: tuple[str, ...] = ("eager", "fused")
    compile: bool = False
    block_shape: ModelShape | None = None
    block_seq: int = TINY_ROWS
    block_values: dict[str, tuple[str, ...]] = field(default_factory=dict)  # knob -> values (first: base)
    comm_bytes: tuple[int, ...] = ()
    # the data-parallel wrappers: rounds of each timed in turn with the unwrapped model (fewer with quick)
    wrapper_rounds: int = 9

    @property
    def block_base(self) -> dict[str, str]:
        """Each block knob at its base (first) value: the settings every block measurement starts from."""
        return {knob: values[0] for knob, values in self.block_values.items()}


DEFAULT_GPU = (
    Workload(ModelShape(16, 2048, 32, 8, 8192, 128256, name="llama3-1b-like"), 2048, (1, 2, 4, 8), (1, 2, 4, 8)),
    Workload(ModelShape(32, 4096, 32, 8, 14336, 128256, name="llama3-8b"), 4096, (1, 2, 4, 8), (1, 2)),
)
DEFAULT_CPU = (
    Workload(ModelShape(4, 64, 4, 2, 176, 256, name="tiny_cpu"), 64, (1, 2), (1, 2, 4, 8)),
    Workload(ModelShape(4, 128, 4, 2, 352, 1024, name="tiny_cpu_128"), 128, (1, 2), (1, 2, 4, 8)),
    Workload(ModelShape(4, 256, 4, 2, 688, 2048, name="tiny_cpu_256"), 256, (1, 2), (1, 2)),
)
GPU_KERNELS = ("flash2", "cudnn", "sdpa_efficient", "sdpa_math")
CPU_KERNELS = ("flash2", "sdpa_math", "eager")


def block_gemms(shape: ModelShape, rows: int, tp: int) -> list[tuple[int, int, int]]:
    """The (m, n, k) of a block's weight GEMMs on one tensor-parallel rank, and of the vocabulary head."""
    h, q, kv = shape.hidden, shape.q_dim // tp, shape.kv_dim // tp
    ffn = max(shape.ffn // tp, 1)
    out = [(rows, q, h), (rows, kv, h), (rows, h, q), (rows, ffn, h), (rows, h, ffn)]
    return out + [(rows, max(shape.vocab // tp, 1), h)]


def elementwise_sizes(shape: ModelShape, rows: int, tp: int) -> list[tuple[str, int, int]]:
    """(op, rows, width) of the block's memory-bound work on one rank, and the loss over its logits."""
    h = shape.hidden
    act = "gelu" if shape.mlp == "gelu" else "swiglu"
    norm = "layernorm" if shape.norm == "layernorm" else "rmsnorm"
    out = [(norm, rows, h), ("add", rows, h), (act, rows, max(shape.ffn // tp, 1))]
    if shape.position == "rope":
        out.append(("rope", rows, (shape.q_dim + shape.kv_dim) // tp))
    if tp > 1 and rows % tp == 0:  # sequence parallelism: the norms and residuals over the rank's rows only
        out += [(norm, rows // tp, h), ("add", rows // tp, h)]
    return out + [("cross_entropy", rows, max(shape.vocab // tp, 1))]


def plan_for(
    workloads: tuple[Workload, ...],
    *,
    kernels: tuple[str, ...],
    norms: tuple[str, ...] = ("eager", "fused"),
    compile_: bool,
    block_values: dict[str, tuple[str, ...]],
    processes: int,
    quick: bool = False,
) -> MeasurePlan:
    """The measurements for `workloads`; `quick` keeps the smallest and largest micro-batch only."""
    plan = MeasurePlan(kernels=kernels, norms=norms, compile=compile_)
    for w in workloads:
        mbs = (min(w.micro_batches), max(w.micro_batches)) if quick else w.micro_batches
        tps = tuple(t for t in w.tps if w.shape.heads % t == 0 and w.shape.kv_heads % t == 0) or (1,)
        for tp in tps:
            for cp in w.cps:
                for b in sorted(set(mbs)):
                    rows = b * w.seq_len // cp
                    plan.gemm.update(block_gemms(w.shape, rows, tp))
                    plan.attention.add((b, w.shape.heads // tp, w.shape.kv_heads // tp, w.shape.head_dim, w.seq_len))
                    plan.elementwise.update(elementwise_sizes(w.shape, rows, tp))
            # the block at a tiny shape (its host overhead) and the optimizer over a stage's parameters
            plan.gemm.update(block_gemms(w.shape, TINY_ROWS, tp))
            plan.elementwise.update(elementwise_sizes(w.shape, TINY_ROWS, tp))
            plan.elementwise.add(("adamw", max(w.shape.num_params // tp, 1), 1))
            plan.elementwise.add(("adamw", max(w.shape.layer_params // tp, 1), 1))
    first = workloads[0]
    plan.block_shape = first.shape
    plan.block_seq = TINY_ROWS
    plan.attention.add((1, first.shape.heads, first.shape.kv_heads, first.shape.head_dim, TINY_ROWS))
    plan.block_values = block_values
    plan.comm_bytes = comm_sizes(workloads, processes=processes, quick=quick)
    plan.wrapper_rounds = 3 if quick else 9
    return plan


def comm_sizes(workloads: tuple[Workload, ...], *, processes: int, quick: bool) -> tuple[int, ...]:
    """Message sizes: powers of 4 from 4 KiB to past the largest a sweep sends (a tensor-parallel
    activation, a stage's gradients in fp32), capped at 256 MiB; fewer with `quick`."""
    largest = 4 * max(max(w.shape.num_params // max(processes, 1), 1) for w in workloads)
    act = max(4 * max(w.micro_batches) * w.seq_len * w.shape.hidden for w in workloads)
    top = min(max(largest, act), 256 << 20)
    sizes, size = [], 4096
    while size < top:
        sizes.append(size)
        size *= 4
    sizes.append(size)
    return tuple(sizes[:: 2 if quick else 1])


def sweep_workloads(sweep: Sweep) -> tuple[Workload, ...]:
    """The sweep's one model at its sequence length, over its space's tp, micro-batch and cp values."""
    space = sweep.space
    return (
        Workload(sweep.model, sweep.seq_len, tuple(space["tp"]), tuple(space["micro_batch_size"]), tuple(space["cp"])),
    )


def sweep_block_values(sweep: Sweep) -> dict[str, tuple[str, ...]]:
    """The values of the block's knobs the sweep searches (the first of each is the measured base)."""
    return {knob: tuple(_text(v) for v in sweep.space[knob]) for knob in BLOCK_KNOBS}


def default_block_values(*, cuda: bool) -> dict[str, tuple[str, ...]]:
    """Without a sweep file: every kernel the device may run, both norms, three checkpointing modes,
    and compile on a GPU (a CPU's compile takes minutes of C++ builds: left out there)."""
    return {
        "attention": GPU_KERNELS if cuda else CPU_KERNELS,
        "rmsnorm": ("eager", "fused"),
        "activation_checkpointing": ("none", "selective", "full"),
        "compile": ("false", "true") if cuda else ("false",),
    }


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
