"""The answer per node count: the best layout of each size, its speed and the cost of the whole run,
and which size is the fastest, the cheapest, and the cheapest within the deadline.

A size with an ok trial is answered by its best measured trial; a size without one by the plan's
best predicted layout, the throughput model scaled by what the sweep's trials measured, with the
error band those trials give the model (`model_band`). The search uses `out_of_play` to leave out
a size that cannot win whatever the band allows. Pure: no torch, no Optuna.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.estimate.cost import RunCost, run_cost
from sweeper.knobs import KNOBS
from sweeper.statuses import PlanStatus, TrialStatus

if TYPE_CHECKING:
    from sweeper.plan.plan import Plan
    from sweeper.spec.schema import GoalSpec
    from sweeper.spec.sweep import Sweep

# The band of a prediction before the sweep measured two sizes' worth of trials: the throughput
# model's spread on public step times (docs/accuracy.md) is within about this share
PRIOR_BAND = 0.3


class Winner(StrEnum):
    """What `sweep best --by` names the winner for."""

    time = "time"
    cost = "cost"


@dataclass(frozen=True)
class SizeAnswer:
    """The best layout of one node count, measured or predicted, and its whole run."""

    nodes: int
    gpus: int
    layout: dict[str, Any] | None  # the knobs, dp and grad_accum; None when no layout can run
    tokens_per_s: float | None
    mfu: float | None
    measured: bool
    trial_number: int | None = None
    band: float | None = None  # a prediction's relative error band (None: measured)
    run: RunCost | None = None
    misses: list[str] = field(default_factory=list)
    why_none: str = ""

    @property
    def gpu_seconds_per_token(self) -> float:
        """What the run costs per token, in GPU time: the ranking of cost, with or without a price."""
        return self.gpus / self.tokens_per_s if self.tokens_per_s else math.inf


@dataclass(frozen=True)
class Marks:
    """Node counts marked in the answer (None: no size qualifies)."""

    fastest: int | None
    cheapest: int | None
    cheapest_in_time: int | None  # cheapest among those within max_days (None without max_days)


def model_band(measured_s: Sequence[float], predicted_s: Sequence[float]) -> float | None:
    """The largest relative error of the scaled model on the sweep's measured trials (None with fewer than 2)."""
    pairs = [(m, p) for m, p in zip(measured_s, predicted_s) if m > 0 and p > 0]
    if len(pairs) < 2:
        return None
    scale = model_scale(measured_s, predicted_s)
    return max(abs(p * scale / m - 1) for m, p in pairs)


def model_scale(measured_s: Sequence[float], predicted_s: Sequence[float]) -> float:
    """Median of measured / predicted step time: how the model is scaled to this sweep (1 without trials)."""
    ratios = [m / p for m, p in zip(measured_s, predicted_s) if m > 0 and p > 0]
    return statistics.median(ratios) if ratios else 1.0


def _with_run(answer: SizeAnswer, goal: GoalSpec | None) -> SizeAnswer:
    if goal is None or not answer.tokens_per_s:
        return answer
    run = run_cost(answer.tokens_per_s, answer.gpus, goal)
    return replace(answer, run=run, misses=run.misses(goal))


def predicted_best(plan: Plan, nodes: int, *, scale: float = 1.0, band: float | None = None) -> SizeAnswer:
    """The plan's best predicted runnable layout at `nodes` (step time times `scale`)."""
    sweep = plan.sweep
    gpus = nodes * sweep.cluster.gpus_per_node
    rows = np.flatnonzero((plan.nodes == nodes) & (plan.status == PlanStatus.CANDIDATE))
    if rows.size == 0:
        why = "no layout of the space is valid and fits the card at this size"
        return SizeAnswer(nodes, gpus, None, None, None, measured=False, why_none=why)
    step = plan.throughput.total[rows] * scale
    i = int(rows[int(np.argmin(step))])
    tps = sweep.global_batch_size * sweep.seq_len / float(step.min())
    layout = {k: _py(plan.cols[k][i]) for k in (*KNOBS, "dp", "grad_accum")}
    mfu = float(plan.pred_mfu[i]) / scale
    answer = SizeAnswer(nodes, gpus, layout, tps, mfu, measured=False, band=PRIOR_BAND if band is None else band)
    return _with_run(answer, sweep.goal)


def measured_best(rows: Sequence[Mapping[str, Any]], nodes: int, sweep: Sweep) -> SizeAnswer | None:
    """The fastest ok trial at `nodes` (by tokens/s), or None when that size has none."""
    ok = [r for r in rows if _nodes(r, sweep) == nodes and r.get("status") == TrialStatus.OK and _tps(r, sweep)]
    if not ok:
        return None
    best = max(ok, key=lambda r: (_tps(r, sweep), -int(r["trial_number"])))
    layout = {k: best.get(k) for k in (*KNOBS, "dp", "grad_accum")}
    gpus = nodes * sweep.cluster.gpus_per_node
    answer = SizeAnswer(
        nodes, gpus, layout, _tps(best, sweep), best.get("mfu"), measured=True, trial_number=int(best["trial_number"])
    )
    return _with_run(answer, sweep.goal)


def _nodes(row: Mapping[str, Any], sweep: Sweep) -> int:
    """A row's node count: its column, else (a row of a sweep of one size) the sweep's."""
    n = row.get("nodes")
    return int(n) if n is not None else sweep.cluster.nodes


def _tps(row: Mapping[str, Any], sweep: Sweep) -> float | None:
    if _number(row.get("tokens_per_s")):
        return float(row["tokens_per_s"])
    t = _number(row.get("step_time_mean_s"))
    return sweep.global_batch_size * sweep.seq_len / t if t else None


def _number(v: Any) -> float | None:
    """A measured value, or None where the row has none (null, or NaN from a pandas frame)."""
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def answers(plan: Plan, rows: Sequence[Mapping[str, Any]]) -> list[SizeAnswer]:
    """One answer per node count: measured where a trial ran ok there, predicted elsewhere (the model
    scaled by the sweep's trials, with their band)."""
    sweep = plan.sweep
    measured, predicted = _pairs(plan, rows)
    scale, band = model_scale(measured, predicted), model_band(measured, predicted)
    out = []
    for n in sweep.node_counts:
        found = measured_best(rows, n, sweep)
        out.append(found if found is not None else predicted_best(plan, n, scale=scale, band=band))
    return out


def plan_answers(plan: Plan) -> tuple[list[SizeAnswer], Marks]:
    """The answer per node count before any trial: `answers` with no rows (each size the plan's
    best predicted layout, the model's prior band) and its marks. The dry run, its --json and
    `sweep best --plan` all show this one, as `sweep best` shows `answers` of measured rows."""
    found = answers(plan, [])
    return found, marks(found, plan.sweep.goal)


def _pairs(plan: Plan, rows: Sequence[Mapping[str, Any]]) -> tuple[list[float], list[float]]:
    """Measured and predicted step times of the sweep's ok trials whose layout the plan holds."""
    from sweeper.layouts.layout import Layout

    measured, predicted = [], []
    for r in rows:
        if r.get("status") != TrialStatus.OK or not _number(r.get("step_time_mean_s")):
            continue
        layout = Layout.from_mapping({k: r[k] for k in KNOBS if r.get(k) is not None})
        n = _nodes(r, plan.sweep)
        i = plan.row_of(layout, nodes=n)
        i = plan.row_of(layout, nodes=n, pruned=True) if i is None else i
        if i is not None:
            measured.append(float(r["step_time_mean_s"]))
            predicted.append(float(plan.throughput.total[i]))
    return measured, predicted


def marks(found: Sequence[SizeAnswer], goal: GoalSpec | None) -> Marks:
    """The fastest size, the cheapest, and (with goal.max_days) the cheapest within the deadline."""
    able = [a for a in found if a.tokens_per_s]
    fastest = max(able, key=lambda a: (a.tokens_per_s, -a.nodes), default=None)
    cheapest = min(able, key=lambda a: (a.gpu_seconds_per_token, a.nodes), default=None)
    in_time = None
    if goal is not None and goal.max_days is not None:
        timely = [a for a in able if a.run is not None and a.run.days <= goal.max_days]
        in_time = min(timely, key=lambda a: (a.gpu_seconds_per_token, a.nodes), default=None)
    return Marks(*(None if a is None else a.nodes for a in (fastest, cheapest, in_time)))


def winner(found: Sequence[SizeAnswer], by: Winner, *, measured: bool = True) -> SizeAnswer | None:
    """The size `sweep best` names: the fastest or the cheapest of those meeting every limit; of
    the measured sizes (`measured`), or of all, predicted too (`sweep best --plan`, before any trial)."""
    ok = [a for a in found if (a.measured or not measured) and a.tokens_per_s and not a.misses]
    if by is Winner.time:
        return max(ok, key=lambda a: (a.tokens_per_s, -a.nodes), default=None)
    return min(ok, key=lambda a: (a.gpu_seconds_per_token, a.nodes), default=None)


def verdict(a: SizeAnswer, goal: GoalSpec | None) -> str:
    """The goal's limits for one size, stated against the model's band where the answer is predicted:
    `met`, `met unless the model is 12 % optimistic`, `misses max_days: 34.9 > 30 unless the model is
    16 % pessimistic`, or `... even at the top of its ±30% band`. Measured: `met` or the misses.

    Pessimistic by x: the true step is the predicted one / (1 + x), so days and cost / (1 + x);
    optimistic by y: days and cost / (1 - y)."""
    if goal is None or a.run is None:
        return ""
    if a.measured or a.band is None:
        return "misses " + "; ".join(a.misses) if a.misses else "met"
    worst = _worst_ratio(a.run, goal)  # the largest of value / limit over the limits set
    if worst is None:
        return "met"
    if a.misses:
        need = worst - 1
        if need <= a.band:
            return f"misses {'; '.join(a.misses)} unless the model is {_pct(need)} pessimistic"
        return f"misses {'; '.join(a.misses)} even at the top of its ±{100 * a.band:.0f}% band"
    room = 1 - worst
    if room < a.band:
        return f"met unless the model is {_pct(room)} optimistic"
    return "met"


def _worst_ratio(run: RunCost, goal: GoalSpec) -> float | None:
    ratios = []
    if goal.max_days is not None:
        ratios.append(run.days / goal.max_days)
    if goal.max_cost is not None and run.cost is not None:
        ratios.append(run.cost / goal.max_cost)
    return max(ratios) if ratios else None


def _pct(share: float) -> str:
    """A share as the verdict words it, rounded up: `14 %` (at least `1 %`: a size at its limit)."""
    return f"{max(1, math.ceil(100 * share - 1e-9)):,} %"


def out_of_play(
    upper_tps: Mapping[int, float], lower_tps: Mapping[int, float], gpus_per_node: int, goal: GoalSpec | None
) -> dict[int, str]:
    """The node counts that cannot win, each with its reason: not the fastest even at the top of its
    band, not the cheapest even then, not the cheapest within max_days, or missing a limit at best.

    `upper_tps`/`lower_tps`: each size's best tokens/s at the top and bottom of its band (a size
    with nothing runnable is absent, and left out as such by the caller)."""
    sizes = sorted(upper_tps)
    cost_lo = {n: n * gpus_per_node / upper_tps[n] for n in sizes}  # GPU-seconds per token, at best
    cost_hi = {n: n * gpus_per_node / lower_tps[n] for n in sizes}
    out: dict[int, str] = {}
    for n in sizes:
        best = at_best(upper_tps[n], n * gpus_per_node, goal)
        if best:
            out[n] = f"misses {'; '.join(best)} even at the top of its band"
    live = [n for n in sizes if n not in out]
    if not live:
        return out
    fastest_floor = max(lower_tps[n] for n in live)
    cheapest_ceiling = min(cost_hi[n] for n in live)
    timely = _surely_in_time(live, lower_tps, goal)
    timely_ceiling = min((cost_hi[n] for n in timely), default=math.inf)
    for n in live:
        can_be_fastest = upper_tps[n] >= fastest_floor
        can_be_cheapest = cost_lo[n] <= cheapest_ceiling
        can_be_cheapest_in_time = goal is not None and goal.max_days is not None and cost_lo[n] <= timely_ceiling
        if not (can_be_fastest or can_be_cheapest or can_be_cheapest_in_time):
            out[n] = (
                f"cannot win: at best {upper_tps[n]:.4g} tokens/s, below another size's worst "
                f"{fastest_floor:.4g}, and {cost_lo[n] * 1e6 / 3600:.4g} GPU-hours per million tokens, "
                f"above another size's worst {cheapest_ceiling * 1e6 / 3600:.4g}"
            )
    return out


def at_best(tps: float, gpus: int, goal: GoalSpec | None) -> list[str]:
    """The goal's limits a run of `tps` tokens/s on `gpus` GPUs misses (none without a goal)."""
    return [] if goal is None else run_cost(tps, gpus, goal).misses(goal)


def _surely_in_time(sizes: Sequence[int], lower_tps: Mapping[int, float], goal: GoalSpec | None) -> list[int]:
    """The sizes that meet max_days even at the bottom of their band."""
    if goal is None or goal.max_days is None:
        return []
    return [n for n in sizes if goal.tokens / lower_tps[n] / 86_400 <= goal.max_days]


def _py(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
