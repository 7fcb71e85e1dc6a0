"""The validated sweep: `Sweep` and its `Cluster`, what every stage after the sweep file reads.

Built by the loader (`sweeper.spec.loader.build_sweep`) from the checked file: the model's shape, the
space, the settings, and the objects the sweep names. The trainer and its memory recipe are carried
as the part the layout rules and the models ask of them (`TrainerTraits`, `MemoryRecipe`), so this
module, and everything below the trainers, imports none of them (`sweeper.trainers.trainer_of`
gives the whole trainer to the stages above).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from sweeper.knobs import Columns
from sweeper.profiles.lookup import MeasuredProfile
from sweeper.spec.goal import GoalSpec
from sweeper.spec.hardware import GPU
from sweeper.spec.hf_config import ModelFile
from sweeper.spec.memory_options import BuiltinMemory, MemoryOptions
from sweeper.spec.models import ModelShape
from sweeper.spec.schema import SearchSettings, TrialSettings, WorkloadSpec
from sweeper.spec.traits import TrainerTraits

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class MemoryRecipe(Protocol):
    """What the memory model (`sweeper.estimate.memory`) asks of the sweep's memory recipe; every
    `sweeper.trainers.base.Recipe` is one."""

    @property
    def reserved_factor(self) -> float: ...

    def states(self, cols: Columns, sweep: Sweep, params: np.ndarray) -> Arrays: ...
    def activations(
        self, cols: Columns, sweep: Sweep, kept: np.ndarray, transient: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]: ...
    def loss_bytes(self, cols: Columns, sweep: Sweep) -> tuple[np.ndarray | float, np.ndarray | float]: ...


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu: GPU
    # the measured profile the model prices the step from (sweeper.estimate.predict), or None: the GPU table. How the
    # model prices, not what is measured: left out of equality and of the sweep's identity
    profile: MeasuredProfile | None = field(default=None, compare=False, repr=False)
    # the link between the nodes as the file names it (`cluster.link`): checked against the profile's
    # and the local nodes' link; like the profile, not part of the sweep's identity
    link: str | None = field(default=None, compare=False)

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: what the planner, the search and the trial runner consume."""

    name: str
    model: ModelShape
    seq_len: int
    global_batch_size: int
    cluster: Cluster
    space: dict[str, tuple[Any, ...]]
    trial: TrialSettings = TrialSettings()
    search: SearchSettings = SearchSettings()
    memory: MemoryOptions = BuiltinMemory()
    launcher: str | dict[str, Any] = "local"
    results_dir: Path = Path("results")
    source: Path | None = field(default=None, compare=False)
    workload: WorkloadSpec = WorkloadSpec()
    # the node counts compared (cluster.nodes a list), smallest first; () or one: a sweep of one size,
    # whose cluster is `cluster`. Each size is `at(n)`: the same model, batch and space on n nodes.
    sizes: tuple[int, ...] = ()
    goal: GoalSpec | None = field(default=None, compare=False)  # how a layout's speed becomes days and cost
    # cluster.gpu as the file spells it where that is an alias (`h100` for h100-sxm), for the dry run to say so
    gpu_alias: str = field(default="", compare=False)
    # the config.json the model was read from (`model: {hf_config: ...}`); its shape is `model`
    model_file: ModelFile | None = field(default=None, compare=False)
    # the trainer of `workload.kind` and the recipe of `memory.recipe`, as the rules and the models ask
    # them; set by the loader from the trainers' registry (`sweeper.trainers`). Derived: not compared
    trainer: TrainerTraits = field(kw_only=True, compare=False, repr=False)
    memory_recipe: MemoryRecipe = field(kw_only=True, compare=False, repr=False)

    @property
    def node_counts(self) -> tuple[int, ...]:
        """Every node count of the sweep (the cluster's alone for a sweep of one size)."""
        return self.sizes or (self.cluster.nodes,)

    @property
    def several_sizes(self) -> bool:
        return len(self.node_counts) > 1

    def at(self, nodes: int) -> Sweep:
        """This sweep on `nodes` nodes: its own world, dp and gradient accumulation, one size."""
        if nodes not in self.node_counts:
            raise ValueError(f"nodes: {nodes} is not one of the sweep's node counts {list(self.node_counts)}")
        return replace(self, cluster=replace(self.cluster, nodes=nodes), sizes=())

    @property
    def results_path(self) -> Path:
        return self.results_dir / self.name
