"""The common shape of a trainer and of its memory recipe: what every class in this package fills in.

Pure core (numpy and pydantic, no torch). The sweep file and the models read these objects through
the registry (`sweeper.trainers`): `memory.py` asks `sweep.memory_recipe` for the model states,
the activations a trainer's checkpointing keeps and its loss; `layout.py` asks `sweep.trainer`
for its attention kernels; `workloads.py` for its flags, environment and log parser.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from sweeper.estimate.memory import compute_bytes
from sweeper.knobs import KNOBS
from sweeper.layouts.stages import layer_params_per_rank
from sweeper.spec.memory_options import MemoryOptions, StateBytes
from sweeper.spec.traits import MEGATRON_LIKE, TimeTraits

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.sweep import Sweep

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
Exporter = Callable[[Mapping[str, Any], "Sweep"], str]


class Recipe(ABC):
    """How a trainer holds memory: its model states by sharding mode, and where its activations,
    loss and allocator differ from the built-in trainer's (the defaults here)."""

    name: ClassVar[str]
    options: ClassVar[type[MemoryOptions]]  # the `memory:` fields this recipe accepts
    # reserved / allocated of PyTorch's caching allocator (fragmentation, cached blocks)
    reserved_factor: ClassVar[float] = 1.10

    @abstractmethod
    def states(self, cols: Columns, sweep: Sweep, params: np.ndarray) -> Arrays:
        """(weights, grads, optimizer, buffers) bytes of `params` parameters on a rank."""

    def activations(
        self, cols: Columns, sweep: Sweep, kept: np.ndarray, transient: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(kept, transient) of one block per micro-batch, from the built-in trainer's terms."""
        return kept, transient

    def loss_bytes(self, cols: Columns, sweep: Sweep) -> tuple[np.ndarray | float, np.ndarray | float]:
        """(kept, transient) bytes per logit of the loss: the fp32 log-softmax kept, and at the
        peak the e-byte logits and an fp32 gradient at once."""
        return 4.0, compute_bytes(sweep) + 4.0

    def summary(self, options: MemoryOptions) -> list[str]:
        """The recipe's options in a few words, as the dry run prints them."""
        return []


def unit_params(cols: Columns, sweep: Sweep) -> np.ndarray:
    """The largest unit sharded data parallel gathers at once: a block, or the embedding when larger."""
    return np.maximum(layer_params_per_rank(cols, sweep), sweep.model.vocab * sweep.model.hidden / cols["tp"])


class TableRecipe(Recipe):
    """A recipe given as bytes per parameter of each state (`table`), sharded or not over dp."""

    @abstractmethod
    def table(self, sweep: Sweep, sharding: str) -> StateBytes:
        """Bytes per parameter and the sharded states for one value of the sharding knob."""

    def buffers(self, sweep: Sweep, table: StateBytes, params: np.ndarray) -> np.ndarray:
        """Transient buffers beside the states (gradient-reduction buckets); none by default."""
        return np.zeros(np.shape(params))

    def states(self, cols: Columns, sweep: Sweep, params: np.ndarray) -> Arrays:
        """Sharded parameters are gathered a unit at a time: two units in 16 bits (the one
        computing, the one prefetched) and one unit's gradient before its reduce-scatter."""
        e = compute_bytes(sweep)
        dp = np.maximum(cols["dp"], 1).astype(float)
        unit = unit_params(cols, sweep)
        out = [np.zeros(np.shape(params)) for _ in range(4)]
        for value in np.unique(cols["sharding"]):
            b = self.table(sweep, str(value))
            rows = cols["sharding"] == value

            def part(name: str, per_param: float, sharded: tuple[str, ...] = tuple(b.sharded)) -> np.ndarray:
                return per_param * params / np.where(name in sharded, dp, 1.0)

            gathered = np.where("params" in b.sharded, 2 * unit * e + unit * b.grads, 0.0)
            weights = part("params", b.params) + part("master", b.master) + gathered
            buffers = self.buffers(sweep, b, params)
            for i, term in enumerate((weights, part("grads", b.grads), part("optimizer", b.optimizer), buffers)):
                out[i] = np.where(rows, term, out[i])
        return out[0], out[1], out[2], out[3]


@dataclass
class ParsedLog:
    """What a trainer's log says about its steps."""

    step_times_s: list[float] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    peak_mem_gib: float | None = None
    peak_mem_reserved_gib: float | None = None
    reported_tflops: list[float] = field(default_factory=list)


EnvNeeds = tuple[dict[str, str | None], list[str]]


class Trainer:
    """What runs a trial: the built-in trainer or an external one's command (`workload.kind`)."""

    kind: ClassVar[str]
    recipe: ClassVar[Recipe]  # its memory recipe (what `memory.recipe` defaults to)
    # the attention kernels it can run; the plan rejects the others (rule kernel_not_in_workload),
    # and those `attention_missing` names where a package they need is not installed
    attention: ClassVar[frozenset[str]] = frozenset(KNOBS["attention"].choices)
    # whether its non-interleaved 1F1B runs fewer micro-batches than stages (warm-up of
    # min(pp - rank - 1, m) forwards, the bubble paid). torch.distributed.pipelining's Schedule1F1B
    # (the built-in trainer, torchtitan) raises "Number of microbatches must be greater than or equal
    # to the number of stages"; an unknown command is not assumed to run it
    runs_short_1f1b: ClassVar[bool] = False
    # whether it runs such a short 1F1B in GPipe's order (all forwards, then all backwards): the
    # memory model then holds every micro-batch on every stage, as GPipe does
    short_1f1b_as_gpipe: ClassVar[bool] = False
    # knob values it has no way to run, each with the reason the plan gives (rule knob_not_in_trainer)
    lacks: ClassVar[Mapping[str, Mapping[Any, str]]] = {}
    runs_command: ClassVar[bool] = True  # an external command (workload.command), not the built-in runner
    exports: ClassVar[Mapping[str, Exporter]] = {}  # `sweep best --format` name -> the winner in its form
    # where its step time departs from the common model (sweeper.estimate.step_time); Megatron-LM's by default
    time: ClassVar[TimeTraits] = MEGATRON_LIKE
    # the attention kernels it runs context parallelism (cp > 1) with; none: it has no context parallelism
    cp_attention: ClassVar[frozenset[str]] = frozenset()
    # which expert tensor-parallel degrees it runs with a tensor-parallel degree (`runs_experts`);
    # "none": no mixture of experts at all; "one_under_ep": etp = 1 where ep > 1, etp = tp without
    expert_tp: ClassVar[Literal["none", "one", "one_or_tp", "one_under_ep", "any"]] = "none"
    # the router scores (`model.router`) its mixture of experts computes
    routers: ClassVar[frozenset[str]] = frozenset({"softmax", "sigmoid"})
    # Megatron-LM asserts sequence parallel wherever expert and tensor parallelism meet
    ep_tp_needs_sp: ClassVar[bool] = False

    def attention_missing(self) -> dict[str, str]:
        """Kernels of `attention` that need a package this installation lacks, each with what it
        needs (`needs the ... package, ...`): the plan refuses them here and says why (none for a
        trainer whose kernels need nothing beyond it)."""
        return {}

    def attention_here(self) -> frozenset[str]:
        """The attention kernels the plan keeps: the trainer's, less those a package here lacks."""
        return self.attention - set(self.attention_missing())

    @property
    def folds_experts_over_tp(self) -> bool:
        """Whether its expert-parallel ranks may come out of the tensor-parallel ones too (Megatron-LM's
        parallel folding, torchtitan's dp_shard*cp*tp), not only out of dp*cp."""
        return self.expert_tp in ("any", "one_or_tp", "one_under_ep")

    def runs_cp(self, cols: Columns) -> np.ndarray:
        """The rows whose context-parallel layout this trainer runs (read where cp > 1): an
        attention kernel of `cp_attention`. A trainer that runs cp with fewer layouts narrows it."""
        return np.isin(cols["attention"], sorted(self.cp_attention) or [""])

    def cp_refusal(self, cols: Columns, i: int) -> str:
        """Why `runs_cp` refuses row i, in a line."""
        kernels = sorted(self.cp_attention)
        if not kernels:
            return f"the {self.kind} trainer runs no context parallelism (cp > 1)"
        attention = cols["attention"][i]
        return f"the {self.kind} trainer runs cp > 1 only with attention {', '.join(kernels)}, not {attention}"

    def runs_experts(self, cols: Columns) -> np.ndarray:
        """The rows whose expert layout (etp against tp) this trainer runs, for a mixture of experts."""
        etp, tp = cols["etp"], cols["tp"]
        allowed = {
            "none": np.zeros(np.shape(etp), dtype=bool),
            "one": etp == 1,
            "one_or_tp": (etp == 1) | (etp == tp),
            "one_under_ep": np.where(cols["ep"] > 1, etp == 1, etp == tp),
        }
        return allowed.get(self.expert_tp, np.ones(np.shape(etp), dtype=bool))

    def experts_refusal(self, cols: Columns, i: int) -> str:
        """Why `runs_experts` refuses row i, in a line."""
        if self.expert_tp == "none":
            return f"the {self.kind} trainer runs no mixture-of-experts model"
        etp, tp = int(cols["etp"][i]), int(cols["tp"][i])
        if self.expert_tp == "one_under_ep":
            return f"the {self.kind} trainer runs etp = 1 with ep > 1 and etp = tp without, not etp = {etp} (tp = {tp})"
        allowed = "1" if self.expert_tp == "one" else f"1 or tp = {tp}"
        return f"the {self.kind} trainer runs etp = {allowed} only, not etp = {etp} (tp = {tp})"

    def refuses(self, cols: Columns, sweep: Sweep) -> np.ndarray:
        """The rows whose knob values, each runnable alone, the trainer refuses together (an assertion
        of its engine: DeepSpeed's pipeline with ZeRO-2/3); none by default (rule combination_not_in_trainer)."""
        return np.zeros(len(cols["tp"]), dtype=bool)

    def refusal(self, cols: Columns, sweep: Sweep, i: int) -> str:
        """Why `refuses` refuses row i, in a line."""
        return ""

    def fewest_1f1b_microbatches(self, pp: np.ndarray) -> np.ndarray:
        """The fewest micro-batches its non-interleaved 1F1B runs with `pp` stages: one where it
        runs fewer than stages (`runs_short_1f1b`), else one per stage."""
        return np.where(self.runs_short_1f1b, 1, pp)

    def flags(self, rec: Mapping[str, Any], steps: int) -> list[str]:
        """`{flags}` of the command: a layout record (`export.layout_record`) as its command-line flags."""
        return []

    def files(self, rec: Mapping[str, Any], sweep: Sweep) -> dict[str, str]:
        """Files a run of this layout reads (name -> text), written into the trial's folder
        (`{workdir}` of the command) before the command starts: a trainer configured by a file."""
        return {}

    def order_argv(self, argv: list[str], flags: list[str]) -> list[str]:
        """The filled-in command, reordered where the trainer's parser needs it."""
        return argv

    def env(self, rec: Mapping[str, Any]) -> EnvNeeds:
        """Environment a run of this layout needs (None: must be unset), with the reasons."""
        return {}, []

    def parse_log(self, text: str, sweep: Sweep) -> ParsedLog:
        """Step times, losses and memory from the trainer's log (a trainer that runs a command)."""
        raise NotImplementedError(f"the {self.kind} trainer runs no command of its own: it writes no log to parse")
