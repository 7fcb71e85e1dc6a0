"""Trainers as objects: one class per trainer a trial can run, registered by `workload.kind`.

Not to be confused with `sweeper.runtime`, the built-in PyTorch trainer's runtime that runs a
trial and imports torch: this package is pure core (no torch) and describes every trainer,
the built-in one included, as the planner sees it. A trainer class (`base.Trainer`) owns what
differs between trainers: its memory recipe and the `memory:` options the sweep file may give it
(`base.Recipe`; the options are declared in `sweeper.spec.memory_options`, whose union the sweep file's `memory:` is), its attention kernels, its command-line flags, environment
and `sweep best` exports, and its log parser. The memory model, the layout rules, the workload
runner and the CLI ask these objects and compare no trainer names.

Adding a trainer: a module here with its class (and a recipe, when it holds memory its own way),
one line in `TRAINERS` below, and its tests; `tests/trainers/test_contract.py` holds every trainer to the
common contract.

May import: foundation, profiles, spec, layouts, estimate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from sweeper.spec.memory_options import OPTION_TYPES, MemoryOptions
from sweeper.spec.traits import BUILTIN_KIND, DEFAULT_RECIPES, TRAINER_KINDS
from sweeper.trainers.base import Exporter, Recipe, Trainer
from sweeper.trainers.builtin import Builtin
from sweeper.trainers.command import Command
from sweeper.trainers.deepspeed import DeepSpeed
from sweeper.trainers.explicit import ExplicitRecipe
from sweeper.trainers.export import to_json, to_yaml
from sweeper.trainers.megatron import Megatron
from sweeper.trainers.nanotron import Nanotron
from sweeper.trainers.torchtitan import Torchtitan

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

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


def trainer_of(sweep: Sweep) -> Trainer:
    """The whole trainer of the sweep (`workload.kind`), for the stages above the models; the rules
    and the models read `sweep.trainer`, the part of it they ask."""
    return TRAINERS[sweep.workload.kind]


def recipe_of(sweep: Sweep) -> Recipe:
    """The whole memory recipe of the sweep (`memory.recipe`)."""
    return RECIPES[sweep.memory.recipe]


def declarations_disagree() -> list[str]:
    """Where the sweep file's declarations of the trainers (`sweeper.spec.traits`: kinds, default
    recipes; `sweeper.spec.memory_options`: the options union) differ from this registry (empty: none)."""
    out = []
    if tuple(TRAINERS) != TRAINER_KINDS:
        out.append(f"kinds: registry {list(TRAINERS)} against spec.traits {list(TRAINER_KINDS)}")
    for kind, t in TRAINERS.items():
        if t.recipe.name != DEFAULT_RECIPES[kind]:
            out.append(f"{kind}: recipe {t.recipe.name} against spec.traits {DEFAULT_RECIPES[kind]}")
        if t.runs_command != (kind != BUILTIN_KIND):
            out.append(f"{kind}: runs_command {t.runs_command} against spec.traits (only {BUILTIN_KIND} runs none)")
    if option_types() != OPTION_TYPES:
        out.append(f"options: registry {option_types()} against spec.memory_options {OPTION_TYPES}")
    return out


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
    "declarations_disagree",
    "memory_record",
    "option_types",
    "recipe_of",
    "trainer_of",
    "recipes_taking",
]
