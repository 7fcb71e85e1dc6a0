"""The report's records for a sweep over several node counts: each size's run (days against cost,
measured apart from predicted) and its scaling efficiency against the smallest size, and the model's
step of each layout priced at its own node count (`predict_at_sizes`). Plain data; `plots.plot_sizes`
draws it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sweeper.estimate.predict import UNCALIBRATED, predict
from sweeper.estimate.step_time import Calibration, StepTime
from sweeper.knobs import Columns
from sweeper.plan.plan import Plan
from sweeper.plan.sizes import SizeAnswer, answers
from sweeper.spec.schema import GoalSpec
from sweeper.spec.sweep import Sweep

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
    max_days: float | None = None  # the goal's limits, drawn as lines (max_cost only with a price: the x axis is cost)
    max_cost: float | None = None


def size_points(plan: Plan, rows: Sequence[Mapping[str, Any]]) -> SizePoints:
    """One point per node count that has a runnable layout (measured where a trial ran ok)."""
    found = [a for a in answers(plan, rows) if a.tokens_per_s]
    goal = plan.sweep.goal
    tokens = goal.tokens if goal is not None else UNIT_TOKENS
    priced = goal is not None and goal.gpu_hour_cost is not None
    base = min(found, key=lambda a: a.nodes) if found else None
    points = [_point(a, base, tokens, goal if priced else None) for a in found]
    cost_label = "cost of the run" if priced else f"GPU-hours for {tokens:.3g} tokens"
    limits = (goal.max_days, goal.max_cost if priced else None) if goal is not None else (None, None)
    return SizePoints(points, cost_label, f"days to train {tokens:.3g} tokens", *limits)


def _point(a: SizeAnswer, base: SizeAnswer | None, tokens: float, goal: GoalSpec | None) -> SizePoint:
    assert a.tokens_per_s and base is not None and base.tokens_per_s
    seconds = tokens / a.tokens_per_s
    gpu_hours = a.gpus * seconds / 3600
    cost = gpu_hours * goal.gpu_hour_cost if goal is not None and goal.gpu_hour_cost is not None else gpu_hours
    efficiency = (a.tokens_per_s / a.gpus) / (base.tokens_per_s / base.gpus)
    return SizePoint(a.nodes, seconds / 86_400, cost, a.measured, a.band, efficiency)


def predict_at_sizes(cols: Columns, sweep: Sweep, calibration: Calibration = UNCALIBRATED) -> StepTime:
    """`estimate.predict.predict` of every layout in `cols` on the cluster of its own node count
    (`cols["nodes"]`): a 32-node trial is priced on 256 GPUs, not on the sweep's first size."""
    if not sweep.several_sizes or "nodes" not in cols:
        return predict(cols, sweep, calibration)
    nodes = np.asarray(cols["nodes"]).astype(int)
    parts: dict[str, np.ndarray] = {}
    compute, comm, mfu = (np.full(len(nodes), np.nan) for _ in range(3))
    for n in np.unique(nodes):
        at = nodes == n
        one = predict({k: np.asarray(v)[at] for k, v in cols.items()}, sweep.at(int(n)), calibration)
        compute[at], comm[at], mfu[at] = one.compute, one.comm, one.mfu
        for k, v in one.parts.items():
            parts.setdefault(k, np.full(len(nodes), np.nan))[at] = v
    return StepTime(compute, comm, calibration, mfu, parts)


def breakdown_at_sizes(cols: Columns, sweep: Sweep, calibration: Calibration = UNCALIBRATED) -> dict[str, np.ndarray]:
    """`estimate.predict.breakdown`, each layout priced at its own node count (`predict_at_sizes`)."""
    out = predict_at_sizes(cols, sweep, calibration).calibrated_parts()
    out["forward"] = (out["matmul"] + out["attention"]) / 3.0
    return out
