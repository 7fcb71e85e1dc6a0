"""Trainers as objects: one class per trainer a trial can run, registered by `workload.kind`.

Not to be confused with `sweeper.runtime` (singular), the built-in PyTorch trainer that runs a
trial and imports torch: this package is pure core (no torch) and describes every trainer,
the built-in one included, as the planner sees it. A trainer class (`base.Trainer`) owns what
differs between trainers: its memory recipe and the `memory:` options the sweep file may give it
(`base.Recipe`, `base.MemoryOptions`), its attention kernels, its command-line flags, environment
and `sweep best` exports, and its log parser. The memory model, the layout rules, the workload
runner and the CLI ask these objects and compare no trainer names.

Adding a trainer: a module here with its class (and a recipe, when it holds memory its own way),
one line in `TRAINERS` below, and its tests; `tests/test_trainers.py` holds every trainer to the
common contract.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from sweeper.trainers.base import Exporter, MemoryOptions, Recipe, Trainer
from sweeper.trainers.builtin import Builtin
from sweeper.trainers.command import Command
from sweeper.trainers.deepspeed import DeepSpeed
from sweeper.trainers.explicit import ExplicitRecipe
from sweeper.trainers.export import to_json, to_yaml
from sweeper.trainers.megatron import Megatron
from sweeper.trainers.nanotron import Nanotron
from sweeper.trainers.torchtitan import Torchtitan

# workload.kind -> the trainer; the first is the default kind
TRAINERS: dict[str, Trainer] = {
    t.kind: t for t in (Builtin(), Megatron(), Torchtitan(), Nanotron(), DeepSpeed(), Command())
}

# memory.recipe -> the recipe: every trainer's own, and those no trainer defaults to
RECIPES: dict[str, Recipe] = {r.name: r for r in (*(t.recipe for t in TRAINERS.values()), ExplicitRecipe())}

# `sweep best --format` -> the winner in that form: the plain records, then every trainer's
EXPORTERS: dict[str, Exporter] = {
    "json": to_json,
    "yaml": to_yaml,
    **{name: fn for t in TRAINERS.values() for name, fn in t.exports.items()},
}


def default_recipe(kind: Any) -> str:
    """memory.recipe when the sweep file leaves it out: the recipe of the workload's trainer
    (the built-in one's for a kind that is not a trainer: the workload check reports it)."""
    trainer = TRAINERS.get(kind) if isinstance(kind, str) else None
    return (trainer or TRAINERS["builtin"]).recipe.name


def recipes_taking(option: str) -> list[str]:
    """The recipes whose `memory:` options include `option` (for the message when another is given it)."""
    return [
        name
        for name, r in RECIPES.items()
        if option in r.options.model_fields and option not in MemoryOptions.model_fields
    ]


def memory_record(options: BaseModel) -> dict[str, Any]:
    """`memory:` as one flat record over every recipe's options (None where this recipe has none).

    The sweep's identity hashes this form: the same as when the sweep file had one memory model
    for every recipe, so results folders recorded then keep their identity.
    """
    flat: dict[str, Any] = {name: None for r in RECIPES.values() for name in r.options.model_fields}
    return flat | options.model_dump()


def option_types() -> tuple[type[MemoryOptions], ...]:
    """Every recipe's options model, in the registry's order (the sweep file's `memory` union)."""
    return tuple(r.options for r in RECIPES.values())


__all__ = [
    "EXPORTERS",
    "RECIPES",
    "TRAINERS",
    "MemoryOptions",
    "Recipe",
    "Trainer",
    "default_recipe",
    "memory_record",
    "option_types",
    "recipes_taking",
]
