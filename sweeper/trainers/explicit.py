"""The explicit memory recipe: bytes per parameter given in the sweep file (`memory.bytes`), for a
trainer whose mixed-precision scheme none of the trainers' recipes describes. A recipe, not a
trainer: any workload may name it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from sweeper.trainers.base import MemoryOptions, StateBytes, TableRecipe

if TYPE_CHECKING:
    from sweeper.spec.schema import Sweep


class ExplicitMemory(MemoryOptions):
    recipe: Literal["explicit"] = "explicit"
    bytes: StateBytes | None = Field(default=None, description="explicit recipe: bytes per parameter")

    @model_validator(mode="after")
    def _bytes_given(self) -> ExplicitMemory:
        if self.bytes is None:
            raise ValueError(
                "memory.bytes is required for recipe explicit: {params, grads, master, optimizer, sharded}"
            )
        return self


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
