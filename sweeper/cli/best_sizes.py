"""`sweep best` for a sweep over several node counts or with a goal: the answer per node count, and
the line naming the winner `--by time` (the fastest run) or `--by cost` (the cheapest) among those
meeting the goal's limits, as `sweeper.results.answer` computes it for every output."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from sweeper.plan.sizes import Marks, SizeAnswer, Winner, plan_answers, verdict, winner
from sweeper.spec.sweep import Sweep

if TYPE_CHECKING:
    from sweeper.plan.plan import Plan
    from sweeper.results.answer import Answer


@dataclass(frozen=True)
class SizeView:
    """The sweep as run, its answer per node count and their marks."""

    sweep: Sweep
    found: list[SizeAnswer]
    marks: Marks


def plan_view(plan: Plan) -> SizeView:
    """The answer per node count before any trial (`plan_answers`), as a view."""
    return SizeView(plan.sweep, *plan_answers(plan))


def view_json(view: SizeView, by: Winner, *, measured: bool = True) -> dict[str, Any]:
    """The answer per node count for `sweep best --format json` (`measured=False`: of the plan's
    predictions, for `--plan` and the dry run's --json)."""
    chosen = winner(view.found, by, measured=measured)
    goal = view.sweep.goal
    return {
        "by": by.value,
        "sizes": [_answer_json(a) | ({"verdict": verdict(a, goal)} if goal is not None else {}) for a in view.found],
        "marks": asdict(view.marks),
        "winner_nodes": None if chosen is None else chosen.nodes,
    }


def _answer_json(a: SizeAnswer) -> dict[str, Any]:
    out = {k: v for k, v in asdict(a).items() if k != "run"}
    if a.run is not None:
        out |= {"days": a.run.days, "gpu_hours": a.run.gpu_hours, "cost": a.run.cost}
    return out


def print_view(view: SizeView, answer: Answer) -> None:
    """The table per node count and the line naming the answer (`sweeper.results.answer`)."""
    from rich.text import Text

    from sweeper.cli.render import make_console
    from sweeper.cli.render_sizes import print_sizes

    console = make_console()
    title = f"{view.sweep.name}: best layout per node count"
    print_sizes(console, view.found, view.marks, view.sweep.goal, title)
    console.print(Text(answer.line()), soft_wrap=True)
