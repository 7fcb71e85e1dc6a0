"""What a trial costs in GPU-hours, and the sweep's budget of them (`search.max_gpu_hours`).

A trial's GPU-hours are its GPUs (its node count x gpus_per_node) x its duration: the launcher's
start-up (`sweeper.launchers.startup.trial_startup`: measured by this sweep's trials, else the
launcher's default; none for a replay) plus `trial.steps` steps at its step time, at most
`trial.timeout_min`. Before a trial starts, the step time is the one the search expects (the
calibrated model corrected by the residual); once it finished, the one it measured over the steps
it ran (a trial that ran none, out of memory or crashed, is charged its start-up alone), with its
own measured start-up where it has one. A replay, whose launcher has no start-up, is charged the
steps its table recorded: what the trials it stands for took. Pure arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.search.residual import PRIOR_SIGMA
from sweeper.search.sizes import (
    bars,
    change_chance,
    confirming,
    in_play,
    reserved,
    size_bounds,
    size_chance,
    sizes_out_of_play,
    trial_value,
    trials_at,
)

if TYPE_CHECKING:
    from sweeper.plan.plan import Plan
    from sweeper.spec.schema import TrialSettings


def trial_gpu_hours(gpus: np.ndarray, step_s: np.ndarray, trial: TrialSettings, startup_s: float) -> np.ndarray:
    """GPU-hours of trials on `gpus` GPUs stepping at `step_s` (module docstring)."""
    seconds = np.minimum(startup_s + trial.steps * np.asarray(step_s, dtype=float), trial.timeout_min * 60)
    return np.asarray(gpus, dtype=float) * seconds / 3600


def spent_gpu_hours(
    rows: Sequence[Mapping[str, Any]], gpus_per_node: int, trial: TrialSettings, startup_s: float
) -> float:
    """GPU-hours the finished trials `rows` took: each its nodes' GPUs x (its measured start-up, else
    `startup_s`, + the steps it ran at its measured mean step time: as many as it recorded, all of
    `trial.steps` when it recorded only the mean, none when it measured no step), at most the time limit."""
    total = 0.0
    for r in rows:
        step = _number(r.get("step_time_mean_s"))
        times = r.get("step_times_s")
        ran = len(times) if times is not None and len(times) else (trial.steps if step else 0)
        start = _number(r.get("startup_s"))
        seconds = min((start if start and start > 0 else startup_s) + ran * (step or 0.0), trial.timeout_min * 60)
        total += int(r.get("nodes") or 1) * gpus_per_node * seconds / 3600
    return total


def _number(v: Any) -> float | None:
    """A measured value, or None where the row has none (null, or NaN from a Parquet file)."""
    return None if v is None or (isinstance(v, float) and v != v) else float(v)


@dataclass(frozen=True)
class SizeShare:
    """One node count's expected share of the sweep: its trials and their GPU-hours."""

    nodes: int
    trials: int
    gpu_hours: float


def expected_split(plan: Plan, startup_s: float) -> list[SizeShare]:
    """How the sweep's trials and GPU-hours are expected to split over its node counts, before any
    trial: the search's rule over sizes (`sweeper.search.sizes`) run on the plan as if each trial
    measured what the uncalibrated model predicts and nothing untried were known closer than the
    model's prior spread (the plan's chance to fit as the chance to run), until
    `search.max_trials`, `search.max_gpu_hours` (no trial started that would overrun it), or every
    size settled. One size: its trials in the order of their predicted speed."""
    sweep = plan.sweep
    rows = np.flatnonzero(plan.candidate_mask)
    nodes, step = plan.nodes[rows], plan.throughput.total[rows]
    hours = trial_gpu_hours(nodes * sweep.cluster.gpus_per_node, step, sweep.trial, startup_s)
    budget = sweep.search.max_gpu_hours or math.inf
    tried = np.zeros(rows.size, dtype=bool)
    spent = 0.0
    for _ in range(sweep.search.max_trials):
        free = np.flatnonzero(~tried & (hours <= budget - spent))
        if not free.size:
            break
        i = _next_trial(plan, step, tried, free, hours)
        if i is None:
            break
        tried[i], spent = True, spent + float(hours[i])
    return [
        SizeShare(int(n), int((tried & (nodes == n)).sum()), float(hours[tried & (nodes == n)].sum()))
        for n in sweep.node_counts
    ]


def _next_trial(plan: Plan, step: np.ndarray, tried: np.ndarray, free: np.ndarray, hours: np.ndarray) -> int | None:
    """Of the `free` layouts (indices into the plan's candidates, stepping at `step`), the one the
    rule spends the next trial on (`sweeper.search.sizes.trial_value`, the plan's chance to fit as the
    chance to run); one size: the fastest predicted. None: every size settled."""
    sweep = plan.sweep
    rows = np.flatnonzero(plan.candidate_mask)
    nodes, speed = plan.nodes[rows], sweep.global_batch_size * sweep.seq_len / step
    if not sweep.several_sizes:
        return int(free[np.argmax(speed[free])])
    untried = np.flatnonzero(~tried)
    sigma = np.full(untried.size, PRIOR_SIGMA)
    measured = {int(i): float(step[i]) for i in np.flatnonzero(tried)}
    bounds = size_bounds(sweep, nodes, measured, untried, step[untried], sigma, step[untried])
    chance = change_chance(sweep, nodes[free], speed[free], np.full(free.size, PRIOR_SIGMA), bars(sweep, bounds.seen))
    ran = trials_at(nodes[tried])
    to_confirm = confirming(sweep, bounds.seen, ran)
    keep_for = reserved(to_confirm, ran, sweep.search.max_trials - int(tried.sum()))
    left_out, chances = sizes_out_of_play(sweep, bounds), size_chance(nodes[free], chance)
    open_rows = in_play(sweep, nodes, free, left_out, chances, to_confirm, keep_for)
    if not open_rows.size:
        return None
    pick = np.isin(free, open_rows)
    value = trial_value(chance[pick], plan.fit_chance[rows[free[pick]]], hours[free[pick]])
    return int(free[pick][np.argmax(value)])


def split_line(shares: Sequence[SizeShare], budget: float | None) -> str:
    """The dry run's line: `search.max_gpu_hours 500: expected split 4 nodes 11 trials 28 GPU-hours,
    ...; 87 of 500 GPU-hours` (one size: its trials and GPU-hours)."""
    parts = [f"{s.nodes} node(s) {s.trials} trial(s) {_hours(s.gpu_hours)} GPU-hours" for s in shares if s.trials]
    total = sum(s.gpu_hours for s in shares)
    head = f"search.max_gpu_hours {budget:g}" if budget is not None else "no search.max_gpu_hours"
    of = f" of {budget:g}" if budget is not None else ""
    return f"{head}: expected split {', '.join(parts) or 'nothing'}; {_hours(total)}{of} GPU-hours"


def spent_line(
    rows: Sequence[Mapping[str, Any]], gpus_per_node: int, trial: TrialSettings, startup_s: float, budget: float | None
) -> str:
    """`sweep run`'s closing line: the GPU-hours the sweep's finished trials took, per node count
    when it ran several, against `search.max_gpu_hours` when set."""
    sizes = sorted({int(r.get("nodes") or 1) for r in rows})
    total = spent_gpu_hours(rows, gpus_per_node, trial, startup_s)
    per = ""
    if len(sizes) > 1:
        each = [
            f"{n} node(s) {_hours(spent_gpu_hours([r for r in rows if int(r.get('nodes') or 1) == n], gpus_per_node, trial, startup_s))}"
            for n in sizes
        ]
        per = f" ({', '.join(each)})"
    left = f" of search.max_gpu_hours {budget:g}, {_hours(max(budget - total, 0.0))} left" if budget is not None else ""
    return f"GPU-hours spent: {_hours(total)} by {len(rows)} trial(s){per}{left}"


def _hours(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"
