"""The report's records for a sweep over several node counts: each size's run (days against cost,
measured apart from predicted) and its scaling efficiency against the smallest size. Plain data;
`plots.plot_sizes` draws it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.plan.plan import Plan
from sweeper.plan.sizes import SizeAnswer, answers
from sweeper.spec.schema import GoalSpec

UNIT_TOKENS = 1e12  # without a goal, days and GPU-hours are per this many tokens


@dataclass(frozen=True)
class SizePoint:
    nodes: int
    days: float
    cost: float  # the goal's cost with a price, else GPU-hours
    measured: bool
    band: float | None  # a prediction's relative error band
    efficiency: float  # (tokens/s per GPU) / (the smallest size's): 1 is perfect scaling


@dataclass(frozen=True)
class SizePoints:
    points: list[SizePoint]
    cost_label: str
    days_label: str


def size_points(plan: Plan, rows: Sequence[Mapping[str, Any]]) -> SizePoints:
    """One point per node count that has a runnable layout (measured where a trial ran ok)."""
    found = [a for a in answers(plan, rows) if a.tokens_per_s]
    goal = plan.sweep.goal
    tokens = goal.tokens if goal is not None else UNIT_TOKENS
    priced = goal is not None and goal.gpu_hour_cost is not None
    base = min(found, key=lambda a: a.nodes) if found else None
    points = [_point(a, base, tokens, goal if priced else None) for a in found]
    cost_label = "cost of the run" if priced else f"GPU-hours for {tokens:.3g} tokens"
    return SizePoints(points, cost_label, f"days to train {tokens:.3g} tokens")


def _point(a: SizeAnswer, base: SizeAnswer | None, tokens: float, goal: GoalSpec | None) -> SizePoint:
    assert a.tokens_per_s and base is not None and base.tokens_per_s
    seconds = tokens / a.tokens_per_s
    gpu_hours = a.gpus * seconds / 3600
    cost = gpu_hours * goal.gpu_hour_cost if goal is not None and goal.gpu_hour_cost is not None else gpu_hours
    efficiency = (a.tokens_per_s / a.gpus) / (base.tokens_per_s / base.gpus)
    return SizePoint(a.nodes, seconds / 86_400, cost, a.measured, a.band, efficiency)
