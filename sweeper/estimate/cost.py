"""The whole training run a layout is for: days to train the goal's tokens, GPU-hours and cost.

Pure arithmetic over tokens/s (measured or predicted) and the GPUs a node count holds; the price
is the sweep file's `goal.gpu_hour_cost` in whatever currency it was given, so nothing here names
a currency. A run that misses `goal.max_days` or `goal.max_cost` says which and by how much.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sweeper.spec.schema import GoalSpec

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class RunCost:
    """One layout's whole run: days, GPU-hours, and cost (None without a price per GPU-hour)."""

    days: float
    gpu_hours: float
    cost: float | None

    def misses(self, goal: GoalSpec) -> list[str]:
        """The goal's limits this run misses, each as `max_days: 72.1 > 60` (empty: it meets them)."""
        out = []
        if goal.max_days is not None and self.days > goal.max_days:
            out.append(f"max_days: {self.days:.1f} > {goal.max_days:g}")
        if goal.max_cost is not None and self.cost is not None and self.cost > goal.max_cost:
            out.append(f"max_cost: {self.cost:.4g} > {goal.max_cost:g}")
        return out


def run_cost(tokens_per_s: float, gpus: int, goal: GoalSpec) -> RunCost:
    """Days, GPU-hours and cost of training `goal.tokens` at `tokens_per_s` on `gpus` GPUs."""
    seconds = goal.tokens / tokens_per_s if tokens_per_s > 0 else math.inf
    gpu_hours = gpus * seconds / 3600
    cost = gpu_hours * goal.gpu_hour_cost if goal.gpu_hour_cost is not None else None
    return RunCost(seconds / SECONDS_PER_DAY, gpu_hours, cost)


def run_columns(tokens_per_s: np.ndarray, gpus: np.ndarray, goal: GoalSpec | None) -> dict[str, np.ndarray]:
    """`pred_tokens_per_s` and, with a goal, `days`, `gpu_hours`, `cost` (with a price) and
    `meets_goal` (False where a limit is missed) as columns over layouts."""
    out = {"pred_tokens_per_s": np.round(tokens_per_s, 1)}
    if goal is None:
        return out
    with np.errstate(divide="ignore", invalid="ignore"):
        seconds = goal.tokens / tokens_per_s
    out["days"] = np.round(seconds / SECONDS_PER_DAY, 3)
    gpu_hours = gpus * seconds / 3600
    out["gpu_hours"] = np.round(gpu_hours, 1)
    meets = np.isfinite(seconds)
    if goal.max_days is not None:
        meets &= seconds / SECONDS_PER_DAY <= goal.max_days
    if goal.gpu_hour_cost is not None:
        cost = gpu_hours * goal.gpu_hour_cost
        out["cost"] = np.round(cost, 2)
        if goal.max_cost is not None:
            meets &= cost <= goal.max_cost
    out["meets_goal"] = meets
    return out


def tokens_per_s(global_batch_size: int, seq_len: int, step_time_s: float) -> float:
    """Tokens trained per second at one optimizer step of `step_time_s`."""
    return global_batch_size * seq_len / step_time_s
