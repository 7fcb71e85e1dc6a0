"""What a trainer declares to the layout rules and the models: its kind, its time traits, its capabilities.

The trainers themselves live above the models (`sweeper.trainers`: their memory recipes, flags and
exports use the models); the rules and the models below them see the sweep's trainer only through
`TrainerTraits`, the part of a trainer object they ask (`Sweep.trainer`), so nothing below the
trainers imports them. Pure: numpy and the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from sweeper.knobs import Columns

# workload.kind: every trainer a trial can run, the default first (`sweeper.trainers.TRAINERS` holds
# one object per kind, in this order, and checks it). The built-in one runs no command of its own.
TRAINER_KINDS = ("builtin", "megatron", "torchtitan", "nanotron", "deepspeed", "command")
BUILTIN_KIND = "builtin"
# memory.recipe when the sweep file leaves it out: the recipe of the workload's trainer (each trainer's
# `recipe`; the registry checks the two agree)
DEFAULT_RECIPES = {kind: ("builtin" if kind == "command" else kind) for kind in TRAINER_KINDS}


def default_recipe(kind: Any) -> str:
    """memory.recipe when the sweep file leaves it out (the built-in one's for a kind that is not a
    trainer: the workload check reports it)."""
    return DEFAULT_RECIPES.get(kind, DEFAULT_RECIPES[BUILTIN_KIND]) if isinstance(kind, str) else "builtin"


@dataclass(frozen=True)
class PipelineStall:
    """A stall some pipeline engines hit at random: a run pays `seconds` more on every micro-batch,
    or nothing, which of the two not following from its layout.

    The share of runs that stall grows with the nodes, a logistic in the node count (half of them
    at `half_nodes`, `width` nodes from 27 % to 73 %). `priced` says what a layout is charged:
    the expected cost (share x seconds) or the typical run's (`seconds` where most runs stall,
    else nothing). For a stall longer than the layouts' differences the typical run's cost orders
    two layouts as most runs of them order (fewer micro-batches first when both stall, the
    layout's own time when neither does, and both stall more often than neither iff the share
    is above half) and meets the median run's step time; the expected cost charges the runs that
    do not stall for the others (benchmarks/throughput_stall.py measures both).
    """

    seconds: float
    half_nodes: float
    width: float
    priced: Literal["expected", "typical"] = "typical"

    def share(self, nodes: float) -> float:
        """The share of runs that stall on `nodes` nodes."""
        z = (nodes - self.half_nodes) / self.width
        return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))  # no overflow

    def cost_s(self, nodes: float) -> float:
        """What a layout is charged per micro-batch on `nodes` nodes."""
        share = self.share(nodes)
        return share * self.seconds if self.priced == "expected" else (self.seconds if share >= 0.5 else 0.0)


@dataclass(frozen=True)
class TimeTraits:
    """How a trainer spends time beyond the layout's physics; the defaults are Megatron-LM's.

    A trainer object carries its own (sweeper.trainers); `predict` takes them as an argument,
    so no trainer is named here. Each field is a measured behaviour of some trainer.
    """

    dp_overlap: float = 0.7  # share of the gradient reduction hidden behind the last backward
    tp_collective_s: float = 15e-6  # fixed cost per tensor-parallel collective (NCCL in a node)
    tp_collective_pp_s: float | None = None  # the same when pp > 1, where a trainer's engine serialises it
    grad_sync_per_microbatch_pp: bool = False  # unsharded DP at pp > 1 reduces gradients every micro-batch
    p2p_latency_s: float = 25e-6  # per pipeline send/receive, on top of its bytes
    microbatch_s: float = 1e-3  # per micro-batch: data, loss, the schedule's Python (Megatron-LM ~1 ms)
    pp_stall: PipelineStall | None = None  # at pp > 1, a random per-micro-batch stall
    # HBM bytes per logit of the loss's elementwise passes, fwd + bwd, on the last stage (its vocab/tp
    # share of every token there); 0: not priced (Megatron-LM's fp32 loss has them too, uncounted)
    loss_traffic_per_logit: float = 0.0
    # near the card the caching allocator frees and retries (torch.cuda.memory_stats'
    # num_alloc_retries): the work slows by up to this share between 90 % and 100 % of the card
    memory_pressure: float = 0.0
    # context parallel's K/V exchange: a ring that overlaps the attention kernel (Megatron-LM / TE
    # p2p) or an all-gather before it (PyTorch's context_parallel "allgather" rotation)
    cp_ring: bool = True
    # unsharded data parallelism is torch's: DDP, or at tp or pp > 1 (where DDP cannot hold DTensor
    # parameters or pipeline stages) FSDP2's `replicate`, with hooks around every block on every micro-batch
    torch_dp_wrappers: bool = False
    # ZeRO-1 sends the updated parameters back as torch's ZeroRedundancyOptimizer does: one broadcast
    # per parameter tensor from the rank that owns it (gloo: a binomial tree), not Megatron-LM's one
    # all-gather of the shards
    zero1_broadcasts: bool = False


MEGATRON_LIKE = TimeTraits()


class TrainerTraits(Protocol):
    """What the layout rules (`sweeper.layouts`) and the models (`sweeper.estimate`) ask of the sweep's
    trainer; every `sweeper.trainers.base.Trainer` is one."""

    @property
    def kind(self) -> str: ...
    @property
    def time(self) -> TimeTraits: ...
    @property
    def lacks(self) -> Mapping[str, Mapping[Any, str]]: ...
    @property
    def short_1f1b_as_gpipe(self) -> bool: ...
    @property
    def ep_tp_needs_sp(self) -> bool: ...
    @property
    def folds_experts_over_tp(self) -> bool: ...

    def attention_missing(self) -> dict[str, str]: ...
    def attention_here(self) -> frozenset[str]: ...
    def fewest_1f1b_microbatches(self, pp: np.ndarray) -> np.ndarray: ...
    # sweep: the Sweep, which imports this module (an import back would be a cycle)
    def refuses(self, cols: Columns, sweep: Any) -> np.ndarray: ...
    def refusal(self, cols: Columns, sweep: Any, i: int) -> str: ...
    def runs_cp(self, cols: Columns) -> np.ndarray: ...
    def cp_refusal(self, cols: Columns, i: int) -> str: ...
    def runs_experts(self, cols: Columns) -> np.ndarray: ...
    def experts_refusal(self, cols: Columns, i: int) -> str: ...
