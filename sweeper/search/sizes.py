"""How the search spends its trials across the node counts of a sweep over several.

Each trial goes to the node count still in play with the fewest trials so far; a size that cannot
win (`sweeper.plan.sizes.out_of_play`: not the fastest, not the cheapest, not the cheapest within the
deadline, or missing a limit, even at the top of the band the sweep's trials give the model) gets
no more trials, and the search keeps its reason (`LayoutSearch.left_out`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from sweeper.plan.sizes import PRIOR_BAND, model_band, out_of_play
from sweeper.statuses import TrialStatus

if TYPE_CHECKING:
    from sweeper.search.search import LayoutSearch


def at_next_size(search: LayoutSearch, rows: np.ndarray) -> np.ndarray:
    """The untried rows of the node count the next trial is spent on: of the sizes still in play,
    the one with the fewest trials so far (the smaller on a tie). A sweep of one size: all of them."""
    sweep = search.sweep
    if not sweep.several_sizes:
        return rows
    search.left_out = sizes_out_of_play(search)
    nodes = search.plan.nodes
    started = Counter(int(nodes[r]) for r in [*search.done, *search.running])
    live = [n for n in sweep.node_counts if n not in search.left_out and bool((nodes[rows] == n).any())]
    if not live:  # every size left out or spent: the rest, as one size's would be
        return rows
    n = min(live, key=lambda s: (started[s], s))
    return rows[nodes[rows] == n]


def sizes_out_of_play(search: LayoutSearch) -> dict[int, str]:
    """The node counts that cannot win, with why: each size's best tokens/s as measured, or as its
    untried layouts are expected (the recalibrated model and the residual), within the band the
    sweep's ok trials give the model (`PRIOR_BAND` before two of them)."""
    sweep, nodes = search.sweep, search.plan.nodes
    measured = {int(r): t for r, t in search.learning.measured.items() if search.outcome.get(int(r)) == TrialStatus.OK}
    rows = np.asarray(list(measured), dtype=np.int64)
    band = model_band(list(measured.values()), search.model_step_s(rows).tolist()) if rows.size else None
    band = PRIOR_BAND if band is None else band
    untried = np.asarray(search.untried(), dtype=np.int64)
    expected = search.expected_step_s(untried) if untried.size else np.zeros(0)
    work = sweep.global_batch_size * sweep.seq_len
    upper, lower = {}, {}
    for n in sweep.node_counts:
        seen = [work / t for r, t in measured.items() if nodes[r] == n]
        at = nodes[untried] == n
        guess = work / float(expected[at].min()) if at.any() else 0.0
        if not seen and not guess:
            continue  # nothing left to run there
        upper[n] = max([*seen, guess * (1 + band)])
        lower[n] = max(seen) if seen else guess * (1 - band)
    return out_of_play(upper, lower, sweep.cluster.gpus_per_node, sweep.goal)
