"""The explicit memory recipe: bytes per parameter given in the sweep file (`memory.bytes`), for a
trainer whose mixed-precision scheme none of the trainers' recipes describes. A recipe, not a
trainer: any workload may name it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sweeper.spec.memory_options import ExplicitMemory, MemoryOptions, StateBytes
from sweeper.trainers.base import TableRecipe

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep


class ExplicitRecipe(TableRecipe):
    name = "explicit"
    options = ExplicitMemory
    reserved_factor = 1.10

    def table(self, sweep: Sweep, sharding: str) -> StateBytes:
        m = sweep.memory
        assert isinstance(m, ExplicitMemory) and m.bytes is not None  # checked by ExplicitMemory
        return m.bytes if sharding != "none" else m.bytes.model_copy(update={"sharded": []})

    def summary(self, options: MemoryOptions) -> list[str]:
        assert isinstance(options, ExplicitMemory) and options.bytes is not None
        b = options.bytes
        return [
            f"bytes/param params {b.params:g}, grads {b.grads:g}, master {b.master:g}, optimizer {b.optimizer:g}",
            f"sharded: {', '.join(b.sharded) or 'none'}",
        ]
