"""The search's choice over the node counts of a sweep over several (the rule: `sweeper.search.sizes`):
what the search believes of each untried layout turned into the next trial, and the model scaled by
the other sizes' trials that keeps a size nothing confirmed in play. Pure numpy over the search's
arrays (`LayoutSearch` gathers them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sweeper.search.residual import PRIOR_SIGMA, calibrate
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
    unconfirmed,
)

if TYPE_CHECKING:
    from sweeper.estimate.step_time import StepTime
    from sweeper.plan.plan import Plan
    from sweeper.search.prior import Prior


@dataclass(frozen=True)
class Belief:
    """What the search believes of its untried layouts (plan rows `untried`): expected step time,
    the residual's spread (log), the model scaled by the other sizes' trials, the chance to run and
    the GPU-hours of each one's trial; the ok trials' step times (plan row -> seconds); the plan rows
    running; and the trials the budget leaves, the next one included (None: no count)."""

    untried: np.ndarray
    expected_s: np.ndarray
    sigma: np.ndarray
    elsewhere_s: np.ndarray
    ok: np.ndarray
    gpu_hours: np.ndarray
    measured: dict[int, float]
    running: tuple[int, ...] = ()
    trials_left: int | None = None


@dataclass(frozen=True)
class SizeChoice:
    """Of the rows offered, what the next trial may be: one row, the open sizes' rows (seed trials
    left), or none (`settled`: every size in play settled within noise); and the sizes left out."""

    rows: np.ndarray
    left_out: dict[int, str]
    settled: bool


def next_over_sizes(plan: Plan, rows: np.ndarray, belief: Belief, *, by_prior: bool) -> SizeChoice:
    """The choice among `rows` (untried plan rows the budget leaves) by the rule of `sweeper.search.sizes`:
    the sizes that cannot win left out, the settled ones closed, and of the rest the row whose trial
    is worth most (`trial_value`); with seed trials left (`by_prior`), every row of the open sizes."""
    sweep, b = plan.sweep, belief
    bounds = size_bounds(sweep, plan.nodes, b.measured, b.untried, b.expected_s, b.sigma, b.elsewhere_s)
    left_out = sizes_out_of_play(sweep, bounds)
    work, nodes = sweep.global_batch_size * sweep.seq_len, plan.nodes[b.untried]
    held = bars(sweep, bounds.seen)
    chance = change_chance(sweep, nodes, work / b.expected_s, b.sigma, held)
    # a size no trial has confirmed (none ran there, or its best is well below what the other sizes'
    # trials predict of it: `unconfirmed`) is not dropped on what the residual learned elsewhere or
    # from its first misses: its chance is at least the one the model scaled by the other sizes'
    # trials gives, at the prior's spread
    unseen = np.isin(nodes, unconfirmed(sweep, nodes, b.elsewhere_s, bounds.seen))
    if unseen.any():
        prior = np.full(int(unseen.sum()), PRIOR_SIGMA)
        from_model = change_chance(sweep, nodes[unseen], work / b.elsewhere_s[unseen], prior, held)
        chance[unseen] = np.maximum(chance[unseen], from_model)
    may = np.isin(b.untried, rows)  # those the budget leaves
    # a size holding an answer on too few of its own trials is not settled (`confirming`)
    to_confirm = confirming(sweep, bounds.seen, trials_at(plan.nodes[list(b.measured)]))
    # the last trials go to an answer's confirmations while it lacks them (`reserved`)
    keep_for = reserved(to_confirm, trials_at(plan.nodes[[*b.measured, *b.running]]), b.trials_left)
    chances = size_chance(nodes[may], chance[may])
    open_rows = in_play(sweep, plan.nodes, rows, left_out, chances, to_confirm, keep_for)
    if not open_rows.size or by_prior:
        return SizeChoice(open_rows, left_out, settled=not open_rows.size)
    pick = np.isin(b.untried, open_rows)
    value = trial_value(chance[pick], b.ok[pick], b.gpu_hours[pick])
    return SizeChoice(b.untried[pick][[int(np.argmax(value))]], left_out, settled=False)


def elsewhere_step_s(
    plan: Plan, model: StepTime, measured: dict[int, float], prior: Prior, rows: np.ndarray
) -> np.ndarray:
    """Step time of each layout at `rows` as the `model` predicts it scaled by what the trials at the
    OTHER sizes measured (`residual.calibrate` without the layout's own size's trials; `prior`: a
    learned profile's scales): a size's predicted best is what the rest of the sweep expects of it,
    not what its own first misses pulled the scales to (those misses are what the size is kept in
    play to check; `sweeper.search.sizes`)."""
    out = np.zeros(len(rows))
    for n in np.unique(plan.nodes[rows]):
        at = plan.nodes[rows] == n
        keep = [r for r in measured if plan.nodes[r] != n]
        c = calibrate(
            model, keep, [measured[r] for r in keep], prior=prior.calibration, prior_weight=prior.calibration_weight
        )
        out[at] = np.maximum(c.compute_scale * model.compute[rows[at]] + c.comm_scale * model.comm[rows[at]], 1e-12)
    return out
