"""How the search spends its trials across the node counts of a sweep over several.

The search serves the answers `sweep best` gives (`served`): `--by time` always, `--by cost` too
when the goal prices the run or caps its cost. What an answer holds now (`bars`) is what `sweep
best` would name: of the sizes whose best measured run meets every limit, the best tokens/s (time)
or tokens/s per GPU (cost). Each untried layout's trial has a chance to change a served answer
(`change_chance`): that its true tokens/s beats what the answer holds by more than `MARGIN` (the
noise of a measured step) and meets the limits, from its expected step time and the residual's
posterior spread, at least `MIN_SIGMA` (never trusted closer to a layout nothing measured) and at
most `PRIOR_SIGMA` upwards (quirks widen the fitted spread, slower, never faster). The next trial
is the layout whose trial is worth most (`trial_value`): that chance times its chance to run, per
GPU-hour its trial is expected to take (`sweeper.search.budget`), so a small size's cheap trials
come first and a large size gets the trials that can still change the answer. The residual is
shared across sizes through the layout's knobs (`sweeper.search.span`): what a layout measured at
one size moves its twins at the others. A size no trial has confirmed (`unconfirmed`: none ran
there, or its best is well below what the other sizes' trials predict of it) keeps at least the
chance the model scaled by the other sizes' trials gives at the prior's spread
(`LayoutSearch.elsewhere_step_s`): it is not dropped on an extrapolation.

A size gets no more trials when it cannot win (`sweeper.plan.sizes.out_of_play` on the bands of
`size_bounds`: not the fastest, not the cheapest, not the cheapest within the deadline, or missing
a limit, even at the top of its band; the search keeps its reason, `LayoutSearch.left_out`) or
once it is settled within noise (`size_chance`: the chance that any of its untried layouts changes
a served answer, as if independent, below `SETTLED`). A size that holds an answer on fewer than
`CONFIRMATIONS` trials of its own is never settled (`confirming`): an answer is confirmed at its
size before its trials stop. Once the trials the budget leaves are no more than the confirmations
such sizes still lack, the rest go to them alone (`reserved`): an answer found late is confirmed at
its size, not left on the trials that found it. When every size in play is settled, the search stops
(`LayoutSearch.settled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.cost import SECONDS_PER_DAY
from sweeper.plan.sizes import Winner, at_best, out_of_play
from sweeper.search.acquisition import FAILED_COST
from sweeper.search.residual import MIN_SIGMA, PRIOR_SIGMA

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

# Two standard deviations of the residual (log step time) either side: before anything is measured
# nearby (residual.PRIOR_SIGMA 0.2) a band of x0.67-1.49, about the throughput model's spread on
# public step times (plan.sizes.PRIOR_BAND, 0.3); one-sided, 2.3 % of layouts fall beyond it.
BAND_SIGMAS = 2.0
# A trial changes an answer when its layout beats what the answer holds by more than the noise of a
# measured step: the replays' and trainers' step-to-step spread is a few % (residual.NOISE, 3 %),
# and a layout 2 % faster than the answer is a tie within that noise, not a new answer.
MARGIN = 0.03
# A size is settled when no untried layout there has even this chance to change a served answer:
# one trial in twenty; below it, the size's trials are better spent where the answer is in doubt.
SETTLED = 0.05
# A size that holds a served answer is not settled on fewer of its own trials that ran: its answer
# rests on the residual's spread, which a few trials say little of. Without it, replayed sweeps of
# the measured-sizes check's tables stopped settled at 18 of their 24 trials with `--by cost`
# answered by 2 trials at its size (benchmarks/sizes_tables.py).
CONFIRMATIONS = 4


@dataclass(frozen=True)
class SizeBounds:
    """Each size's best tokens/s at the top (`upper`) and bottom (`lower`) of its band, and its best measured."""

    upper: dict[int, float]
    lower: dict[int, float]
    seen: dict[int, float]


def size_bounds(
    sweep: Sweep,
    nodes: np.ndarray,
    measured: dict[int, float],
    untried: np.ndarray,
    expected_step_s: np.ndarray,
    log_sigma: np.ndarray,
    model_step_s: np.ndarray,
) -> SizeBounds:
    """The band of each size's best: `measured` (ok plan rows -> step seconds) and the `untried` rows
    with their expected step time (`expected_step_s`), its posterior spread (`log_sigma`, log space)
    and the model's step time scaled by the other sizes' trials (`model_step_s`, without the residual).
    An untried layout's band is at least `MIN_SIGMA` wide and its top uses at most the prior's spread
    (`PRIOR_SIGMA`). A size with
    nothing measured and nothing left to run is absent.

    While a size's best so far is well below its predicted best (below the bottom of the prior band
    around the scaled model's best untried layout), the top of its band is at least the top of
    that layout's prior band: trials there so far missed what the model expects of the size, and the
    residual, which learned only those misses, must not be the reason it is dropped."""
    work = sweep.global_batch_size * sweep.seq_len
    prior_band = math.exp(BAND_SIGMAS * PRIOR_SIGMA)
    upper, lower, seen = {}, {}, {}
    for n in sweep.node_counts:
        found = [work / t for r, t in measured.items() if nodes[r] == n]
        at = nodes[untried] == n
        if not found and not at.any():
            continue
        speed = work / expected_step_s[at] if at.any() else np.zeros(0)
        # never narrower than MIN_SIGMA (a fitted process can claim a few % at a layout nothing measured,
        # and one trial's miss would then close its whole size, as in change_chance); quirks widen the
        # fitted spread: slower, never faster
        spread = np.maximum(log_sigma[at], MIN_SIGMA)
        top = float(np.max(speed * np.exp(BAND_SIGMAS * np.minimum(spread, PRIOR_SIGMA)), initial=0.0))
        bottom = float(np.max(speed * np.exp(-BAND_SIGMAS * spread), initial=0.0))
        predicted = work / float(model_step_s[at].min()) if at.any() else 0.0
        seen[n] = max(found, default=0.0)
        if seen[n] < predicted / prior_band:
            top = max(top, predicted * prior_band)
        upper[n] = max(seen[n], top)
        lower[n] = seen[n] if found else bottom
    return SizeBounds(upper, lower, seen)


def sizes_out_of_play(sweep: Sweep, bounds: SizeBounds) -> dict[int, str]:
    """The node counts that cannot win, with why (`sweeper.plan.sizes.out_of_play` on their bands)."""
    return out_of_play(bounds.upper, bounds.lower, sweep.cluster.gpus_per_node, sweep.goal)


def served(sweep: Sweep) -> tuple[Winner, ...]:
    """The answers the search spends its trials on: `--by time` (`sweep best`'s default) always, and
    `--by cost` too when the goal prices the run (`gpu_hour_cost`) or caps its cost (`max_cost`)."""
    goal = sweep.goal
    priced = goal is not None and (goal.gpu_hour_cost is not None or goal.max_cost is not None)
    return (Winner.time, Winner.cost) if priced else (Winner.time,)


def holders(sweep: Sweep, seen: dict[int, float]) -> dict[Winner, tuple[int, float]]:
    """Who holds each served answer now, as `sweep best` names it (`sweeper.plan.sizes.winner`): of
    the sizes whose best measured run (`seen`, tokens/s) meets every limit, the one with the best
    tokens/s (time) or tokens/s per GPU (cost), with that value; absent while no size's does."""
    gpn = sweep.cluster.gpus_per_node
    able = {n: s for n, s in seen.items() if s > 0 and not at_best(s, n * gpn, sweep.goal)}
    out = {}
    for by in served(sweep):
        value = {n: s if by is Winner.time else s / (n * gpn) for n, s in able.items()}
        if value:
            n = max(value, key=lambda k: value[k])
            out[by] = (n, value[n])
    return out


def bars(sweep: Sweep, seen: dict[int, float]) -> dict[Winner, float]:
    """What each served answer holds now (`holders`): the best tokens/s (time) or tokens/s per GPU
    (cost); 0 while no size meets every limit (any trial that runs and meets them changes it)."""
    held = holders(sweep, seen)
    return {by: held[by][1] if by in held else 0.0 for by in served(sweep)}


def confirming(sweep: Sweep, seen: dict[int, float], ran: dict[int, int]) -> set[int]:
    """The sizes that hold a served answer (`holders`) on fewer than `CONFIRMATIONS` trials that ran
    there (`ran`: node count -> trials that ran ok): not settled, whatever their chance (`in_play`)."""
    return {n for n, _ in holders(sweep, seen).values() if ran.get(n, 0) < CONFIRMATIONS}


def reserved(to_confirm: set[int], ran: dict[int, int], trials_left: int | None) -> set[int]:
    """The sizes the rest of the trial budget is kept for: those of `to_confirm` (`confirming`) once the
    trials the budget leaves (`trials_left`, the next one included; None: no count) are no more than
    the confirmations they still lack (`CONFIRMATIONS` less `ran`: node count -> trials that ran ok
    or are running there); none before. Without it, replayed sweeps whose answer turned up in their
    last few trials ended with it on 2-3 trials at its size (benchmarks/sizes_tables.py)."""
    lacking = {n: CONFIRMATIONS - ran.get(n, 0) for n in to_confirm}
    owed = {n: k for n, k in lacking.items() if k > 0}
    if trials_left is None or not owed or trials_left > sum(owed.values()):
        return set()
    return set(owed)


def trials_at(nodes: np.ndarray) -> dict[int, int]:
    """How many trials ran at each node count (`nodes`: one entry per trial that ran)."""
    return {int(n): int(k) for n, k in zip(*np.unique(nodes, return_counts=True))}


def limit_speed(sweep: Sweep, gpus: np.ndarray) -> np.ndarray:
    """The least tokens/s that meets the goal's limits on `gpus` GPUs (0 without limits): max_days
    needs tokens / (max_days x 86400), max_cost gpus x tokens x price / (3600 x max_cost)."""
    goal, out = sweep.goal, np.zeros(len(gpus))
    if goal is None:
        return out
    if goal.max_days is not None:
        out = np.maximum(out, goal.tokens / (goal.max_days * SECONDS_PER_DAY))
    if goal.max_cost is not None and goal.gpu_hour_cost is not None:
        out = np.maximum(out, gpus * goal.tokens * goal.gpu_hour_cost / (3600 * goal.max_cost))
    return out


def change_chance(
    sweep: Sweep, nodes: np.ndarray, speed: np.ndarray, sigma: np.ndarray, held: dict[Winner, float]
) -> np.ndarray:
    """Per untried layout (its node count, expected tokens/s `speed` and posterior spread `sigma` of
    its log step time): the chance its trial changes a served answer, that its true tokens/s beats
    what the answer holds (`held`, from `bars`) by more than `MARGIN` (by time its tokens/s, by cost
    its tokens/s per GPU) and meets the goal's limits. Upwards the spread is at most the prior's
    (`PRIOR_SIGMA`): quirks widen the fitted spread, slower, never faster."""
    gpus = nodes * sweep.cluster.gpus_per_node
    need = np.full(len(speed), np.inf)
    for by, value in held.items():
        need = np.minimum(need, value * (1 + MARGIN) * (gpus if by is Winner.cost else 1.0))
    need = np.maximum(need, limit_speed(sweep, gpus))
    up = np.clip(sigma, MIN_SIGMA, PRIOR_SIGMA)
    with np.errstate(divide="ignore"):
        z = (np.log(need) - np.log(np.maximum(speed, 1e-300))) / up
    return 0.5 * np.asarray(_erfc(z / math.sqrt(2)), dtype=float)


def unconfirmed(sweep: Sweep, nodes: np.ndarray, model_step_s: np.ndarray, seen: dict[int, float]) -> list[int]:
    """The node counts no trial has confirmed: none ran ok there, or its best so far (`seen`, tokens/s)
    is below the bottom of the prior band around its best untried layout as the model scaled by the
    other sizes' trials predicts it (`model_step_s` of the untried layouts at `nodes`), as in `size_bounds`."""
    work = sweep.global_batch_size * sweep.seq_len
    band = math.exp(BAND_SIGMAS * PRIOR_SIGMA)
    out = []
    for n in np.unique(nodes):
        predicted = work / float(model_step_s[nodes == n].min())
        if seen.get(int(n), 0.0) < predicted / band:
            out.append(int(n))
    return out


# the C library's erfc over an array: scipy.special's, imported at the top of this module, cost every
# command that reads the answer over sizes (status, best, the dry run) about 0.27 s of CPU to import
_erfc = np.frompyfunc(math.erfc, 1, 1)


def size_chance(nodes: np.ndarray, chance: np.ndarray) -> dict[int, float]:
    """Per node count: the chance that any of its untried layouts (their node count and
    `change_chance`) changes a served answer, as if they were independent (1 - the product of each
    one's chance not to). Below `SETTLED`, the size's part of the answer is settled within noise."""
    return {int(n): float(1.0 - np.prod(1.0 - chance[nodes == n])) for n in np.unique(nodes)}


def in_play(
    sweep: Sweep,
    nodes: np.ndarray,
    rows: np.ndarray,
    left_out: dict[int, str],
    chance: dict[int, float],
    to_confirm: set[int] | None = None,
    keep_for: set[int] | None = None,
) -> np.ndarray:
    """The untried `rows` the next trial may be spent on: those of the sizes that can still win (not in
    `left_out`) and are not settled (`size_chance` at least `SETTLED`, or holding an answer on too
    few trials: `to_confirm`, from `confirming`); none when every such size is settled (the answer
    is settled within noise). Of those, only the sizes the rest of the budget is kept for
    (`keep_for`, from `reserved`) while any has a row. A sweep of one size, or every size left out: all."""
    if not sweep.several_sizes:
        return rows
    live = [n for n in sweep.node_counts if n not in left_out and bool((nodes[rows] == n).any())]
    if not live:  # every size left out: the rest, as one size's would be
        return rows
    keep = to_confirm or set()
    open_sizes = [n for n in live if chance.get(n, 0.0) >= SETTLED or n in keep]
    kept = [n for n in open_sizes if n in (keep_for or set())]
    return rows[np.isin(nodes[rows], kept or open_sizes)]


def trial_value(chance: np.ndarray, ok: np.ndarray, gpu_hours: np.ndarray) -> np.ndarray:
    """What each untried layout's trial is worth: the chance it runs (`ok`) and changes a served
    answer (`chance`), per GPU-hour it is expected to take; a trial that fails (out of memory)
    ends at its first step, `acquisition.FAILED_COST` of one that runs."""
    return chance * ok / ((ok + (1 - ok) * FAILED_COST) * np.maximum(gpu_hours, 1e-12))
