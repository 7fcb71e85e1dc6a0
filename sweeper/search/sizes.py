"""How the search spends its trials across the node counts of a sweep over several.

Each size's best is bounded by what the search believes: at least its best measured tokens/s (or,
before any trial there, its best untried layout's expected speed at the bottom of its band), at most
the better of that and its best untried layout at the top of its band. The band of an untried
layout is the residual's posterior spread there (`BAND_SIGMAS` standard deviations of log step time:
the model's prior error where nothing near was measured, less near what was), never wider above
than the prior's: the residual's fitted amplitude grows with quirks (layouts several times SLOWER
than the model says), which say nothing of a layout being faster than it says, and a band that
wide at every size with hundreds of untried layouts kept the sizes already measured near their
best in play and took the trials a size far from its prediction needed. A size whose trials so
far are well below its predicted best (the model scaled by the OTHER sizes' trials:
`LayoutSearch.elsewhere_step_s`; its own misses are what is in doubt) stays in play until the
layouts the model ranks high there have run or been judged by their neighbours.

A size that cannot win (`sweeper.plan.sizes.out_of_play`: not the fastest, not the cheapest, not the
cheapest within the deadline, or missing a limit, even at the top of its band) gets no more trials,
and the search keeps its reason (`LayoutSearch.left_out`). Of the sizes in play, a size without a
trial comes first (the smaller first); then the next trial goes where the band is widest: the size
whose top of its band reaches furthest above the best found so far, by time (tokens/s of the whole
run) or by cost (tokens/s per GPU), whichever it reaches further. The best found so far is the
winner's bar: a size whose band reaches far above it is the one a trial is most likely to change
the answer at, and the leader itself is refined while its own band reaches above its best.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from sweeper.plan.sizes import out_of_play
from sweeper.search.residual import PRIOR_SIGMA

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep

# Two standard deviations of the residual (log step time) either side: before anything is measured
# nearby (residual.PRIOR_SIGMA 0.2) a band of x0.67-1.49, about the throughput model's spread on
# public step times (plan.sizes.PRIOR_BAND, 0.3); one-sided, 2.3 % of layouts fall beyond it.
BAND_SIGMAS = 2.0


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
    The top of an untried layout's band uses at most the prior's spread (`PRIOR_SIGMA`). A size with
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
        up = np.minimum(log_sigma[at], PRIOR_SIGMA)  # quirks widen the fitted spread: slower, never faster
        top = float(np.max(speed * np.exp(BAND_SIGMAS * up), initial=0.0))
        bottom = float(np.max(speed * np.exp(-BAND_SIGMAS * log_sigma[at]), initial=0.0))
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


def reach(bounds: SizeBounds) -> dict[int, float]:
    """How far (log) the top of each size's band reaches above the bar it must clear to win: by time
    (its whole run's tokens/s against the fastest size's best found) or by cost (tokens/s per GPU
    against the cheapest's), the further of the two. The size that holds a mark is not measured for
    it: its own trials cannot take the mark from it, a challenger's can. Infinite before anything ran."""
    found = {n: s for n, s in bounds.seen.items() if s > 0}
    if not found:
        return dict.fromkeys(bounds.upper, math.inf)
    fastest = max(found, key=lambda m: found[m])
    cheapest = max(found, key=lambda m: found[m] / m)
    out = {}
    for n, top in bounds.upper.items():
        by_time = math.log(top / found[fastest]) if top > 0 and n != fastest else -math.inf
        by_cost = math.log(top / n / (found[cheapest] / cheapest)) if top > 0 and n != cheapest else -math.inf
        out[n] = max(by_time, by_cost)
    return out


def at_next_size(
    sweep: Sweep,
    nodes: np.ndarray,
    rows: np.ndarray,
    started: list[int],
    left_out: dict[int, str],
    reaches: dict[int, float] | None = None,
) -> np.ndarray:
    """The untried `rows` of the node count the next trial is spent on: of the sizes still in play
    (not in `left_out`), one without a trial yet (`started`: plan rows done or running; the smaller
    first), else the one whose band reaches furthest above the best found (`reaches`; without them,
    the one with the fewest trials). A sweep of one size: all of them."""
    if not sweep.several_sizes:
        return rows
    count = Counter(int(nodes[r]) for r in started)
    live = [n for n in sweep.node_counts if n not in left_out and bool((nodes[rows] == n).any())]
    if not live:  # every size left out or spent: the rest, as one size's would be
        return rows
    fresh = [n for n in live if count[n] == 0]
    if fresh or reaches is None:
        n = min(fresh or live, key=lambda s: (count[s], s))
    else:
        n = max(live, key=lambda s: (reaches.get(s, -math.inf), -count[s], -s))
    return rows[nodes[rows] == n]
