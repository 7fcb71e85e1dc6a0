"""The answer per node count as a terminal table: the dry run's predicted best of each size, and
`sweep best`'s measured (or predicted) best with the fastest, cheapest and in-time marks."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from sweeper.plan.sizes import Marks, SizeAnswer, verdict
from sweeper.spec.goal import goal_line
from sweeper.spec.schema import GoalSpec


def size_table(found: Sequence[SizeAnswer], marks: Marks, goal: GoalSpec | None, *, title: str) -> Table:
    """One row per node count: best layout, tokens/s, MFU, and with a goal days, GPU-hours, cost, limits."""
    table = Table(title=title, title_justify="left", header_style="bold")
    cols = ["nodes", "GPUs", "tp", "pp", "dp", "mbs", "accum", "tokens/s", "MFU", "from"]
    if goal is not None:
        cols += ["days", "GPU-hours", *(["cost"] if goal.gpu_hour_cost is not None else []), "limits"]
    for c in [*cols, "marks"]:
        table.add_column(c, justify="left" if c in ("from", "limits", "marks") else "right")
    for a in found:
        table.add_row(*_cells(a, goal), _marks_of(a.nodes, marks))
    return table


def _cells(a: SizeAnswer, goal: GoalSpec | None) -> list[str]:
    lay = a.layout or {}
    knobs = [str(lay.get(k, "-")) for k in ("tp", "pp", "dp", "micro_batch_size", "grad_accum")]
    if a.tokens_per_s is None:
        return [str(a.nodes), str(a.gpus), *knobs, "-", "-", a.why_none] + (_blank(goal))
    source = f"trial {a.trial_number}" if a.measured else _predicted(a.band)
    cells = [str(a.nodes), str(a.gpus), *knobs, f"{a.tokens_per_s:,.0f}", f"{100 * (a.mfu or 0):.1f}%", source]
    if goal is None:
        return cells
    run = a.run
    assert run is not None
    cells += [f"{run.days:.1f}", f"{run.gpu_hours:,.0f}"]
    if goal.gpu_hour_cost is not None:
        cells.append(f"{run.cost:,.0f}")
    cells.append(verdict(a, goal))
    return cells


def _blank(goal: GoalSpec | None) -> list[str]:
    if goal is None:
        return []
    return ["-"] * (3 + (goal.gpu_hour_cost is not None))


def _predicted(band: float | None) -> str:
    return "predicted" if band is None else f"predicted ±{100 * band:.0f}%"


def _marks_of(nodes: int, marks: Marks) -> str:
    names = [
        ("fastest", marks.fastest),
        ("cheapest", marks.cheapest),
        ("cheapest within max_days", marks.cheapest_in_time),
    ]
    return ", ".join(name for name, n in names if n == nodes)


def print_sizes(console: Console, found: Sequence[SizeAnswer], marks: Marks, goal: GoalSpec | None, title: str) -> None:
    console.print(size_table(found, marks, goal, title=title))
    if goal is not None:
        console.print(goal_line(goal))
