"""`sweep best` for a sweep over several node counts or with a goal: the answer per node count, and
the winner `--by time` (the fastest run) or `--by cost` (the cheapest) among those meeting the
goal's limits, with the sweep at the node count it was chosen for (what its exports are written for)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.errors import NoSuccessError, SweepError
from sweeper.plan.sizes import Marks, SizeAnswer, Winner, answers, marks, plan_answers, verdict, winner
from sweeper.spec.sweep import Sweep

if TYPE_CHECKING:
    from sweeper.plan.plan import Plan


@dataclass(frozen=True)
class SizeView:
    """The sweep as run, its answer per node count and their marks."""

    sweep: Sweep
    found: list[SizeAnswer]
    marks: Marks


def size_view(rows: Sequence[Mapping[str, Any]], root: Path, spec: str) -> SizeView | None:
    """The answer per node count; None for a sweep of one size without a goal (or no readable sweep file)."""
    from sweeper.plan.plan import make_plan
    from sweeper.results.rows import sweep_as_run

    try:
        sweep = sweep_as_run(root, spec)
    except SweepError:
        return None
    if not sweep.several_sizes and sweep.goal is None:
        return None
    found = answers(make_plan(sweep), rows)
    return SizeView(sweep, found, marks(found, sweep.goal))


def plan_view(plan: Plan) -> SizeView:
    """The answer per node count before any trial (`plan_answers`), as a view."""
    return SizeView(plan.sweep, *plan_answers(plan))


def winner_row(
    rows: Sequence[Mapping[str, Any]], view: SizeView, by: Winner
) -> tuple[Mapping[str, Any], Sweep, SizeAnswer]:
    """The winning trial's row `--by` time or cost, the sweep at its node count, and its answer;
    NoSuccessError when no measured size meets the goal's limits."""
    chosen = winner(view.found, by)
    if chosen is None:
        missed = [f"{a.nodes}: {'; '.join(a.misses)}" for a in view.found if a.misses]
        why = f" (limits missed: {', '.join(missed)})" if missed else ""
        raise NoSuccessError(f"no measured node count meets the goal{why}")
    row = next(r for r in rows if r["trial_number"] == chosen.trial_number)
    return row, view.sweep.at(chosen.nodes), chosen


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


def print_view(view: SizeView, by: Winner) -> None:
    """The table per node count and the line naming the winner."""
    from rich.text import Text

    from sweeper.cli.render import make_console
    from sweeper.cli.render_sizes import print_sizes

    console = make_console()
    title = f"{view.sweep.name}: best layout per node count"
    print_sizes(console, view.found, view.marks, view.sweep.goal, title)
    chosen = winner(view.found, by)
    if chosen is None:
        console.print(Text(f"--by {by.value}: no measured node count meets the goal's limits"), soft_wrap=True)
        return
    what = "fastest" if by is Winner.time else "cheapest"
    console.print(
        Text(f"--by {by.value}: {chosen.nodes} node(s), trial {chosen.trial_number}, the {what} measured run"),
        soft_wrap=True,
    )
