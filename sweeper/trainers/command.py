"""Any command (`workload.kind: command`): the layout reaches it through placeholders ({tp}, ...),
not flags; its log may be in Megatron-LM's or torchtitan's format."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from sweeper.trainers.base import ParsedLog, Recipe, Trainer
from sweeper.trainers.builtin import BuiltinRecipe
from sweeper.trainers.megatron import parse_megatron
from sweeper.trainers.torchtitan import parse_torchtitan_of

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep


class Command(Trainer):
    """A command of the user's own; memory as the built-in trainer holds it unless memory.recipe says."""

    kind = "command"
    recipe: ClassVar[Recipe] = BuiltinRecipe()

    def parse_log(self, text: str, sweep: Sweep) -> ParsedLog:
        # a plain command may print either format
        parsed = parse_megatron(text)
        return parsed if parsed.step_times_s else parse_torchtitan_of(text, sweep)
