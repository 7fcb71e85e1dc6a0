"""The report's panel for a sweep over several node counts (or with a goal): each size's best, measured
with its MFU interval or predicted with its band, its tokens/s, days (with the interval the trial's
step-time noise gives), GPU-hours and cost, the goal's verdict, and the answer `--by` the page follows
(`sweeper.results.answer`), the goal's limits named beside it."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from sweeper.plan.sizes import SizeAnswer, verdict
from sweeper.results.answer import Answer
from sweeper.results.noise import INTERVAL_NAME, row_interval, row_mfu_range
from sweeper.spec.goal import GoalSpec, goal_line


def sizes_panel(answer: Answer, rows: Sequence[Mapping[str, Any]]) -> str:
    """The HTML panel: one row per node count and, under it, the answer and the goal's limits."""
    if answer.found is None or answer.marks is None:
        return ""
    goal = answer.sweep.goal
    by_trial = {int(r["trial_number"]): r for r in rows}
    head = ["nodes", "GPUs", "best", "tp", "pp", "dp", "mbs", "tokens/s", "MFU", "MFU 95%"]
    if goal is not None:
        head += ["days", "days 95%", "GPU-hours", *(["cost"] if goal.gpu_hour_cost is not None else []), "limits"]
    head.append("marks")
    marks = answer.marks
    named = (
        ("fastest", marks.fastest),
        ("cheapest", marks.cheapest),
        ("cheapest within max_days", marks.cheapest_in_time),
    )
    body = []
    for a in answer.found:
        cells = _cells(a, by_trial.get(a.trial_number) if a.trial_number is not None else None, goal)
        row = cells + [", ".join(n for n, at in named if at == a.nodes)]
        style = " class=answer" if a.nodes == answer.nodes else ""
        body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>")
    limits = html.escape(goal_line(goal)) if goal is not None else "no goal: days and cost are not computed"
    return (
        "<h2>The answer per node count</h2><table class=sizes><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + "".join(body)
        + f"</table><p class=answer-line>{html.escape(answer.line())}</p><p class=caption>{limits}. "
        f"Measured sizes: their best trial, with the MFU and days at the ends of its {INTERVAL_NAME}; a size "
        "without an ok trial: the plan's best predicted layout, the model scaled by the sweep's trials, "
        "with its band. The highlighted row is the node count the answer is for.</p>"
    )


def _cells(a: SizeAnswer, row: Mapping[str, Any] | None, goal: GoalSpec | None) -> list[str]:
    lay = a.layout or {}
    knobs = [str(lay.get(k, "-")) for k in ("tp", "pp", "dp", "micro_batch_size")]
    blank = [] if goal is None else ["-"] * (4 + (goal.gpu_hour_cost is not None))
    if a.tokens_per_s is None:
        return [str(a.nodes), str(a.gpus), a.why_none, *knobs, "-", "-", "-", *blank]
    source = f"trial {a.trial_number}" if a.measured else f"predicted ±{100 * (a.band or 0):.0f}%"
    interval = row_mfu_range(row) if row is not None else "-"
    cells = [
        str(a.nodes),
        str(a.gpus),
        source,
        *knobs,
        f"{a.tokens_per_s:,.0f}",
        f"{100 * (a.mfu or 0):.1f}%",
        interval,
    ]
    if goal is None or a.run is None:
        return cells + blank
    cost = [] if goal.gpu_hour_cost is None else [f"{a.run.cost or 0:,.0f}"]
    return cells + [f"{a.run.days:.1f}", _days_range(a, row), f"{a.run.gpu_hours:,.0f}", *cost, verdict(a, goal)]


def _days_range(a: SizeAnswer, row: Mapping[str, Any] | None) -> str:
    """The run's days at the ends of the trial's step-time interval (a prediction: its band)."""
    assert a.run is not None
    days = a.run.days
    if not a.measured:
        band = a.band or 0.0
        return f"{days / (1 + band):.1f}–{days / (1 - band):.1f}" if band < 1 else f"{days / (1 + band):.1f}–∞"
    iv = row_interval(row) if row is not None else None
    if iv is None:
        return "-"
    h = iv.half_width_s / iv.mean_s
    return f"{days * (1 - h):.1f}–{days * (1 + h):.1f}"
