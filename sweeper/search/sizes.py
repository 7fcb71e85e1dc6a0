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

if TYPE_CHECKING:
    from sweeper.spec.sweep import Sweep


def at_next_size(
    sweep: Sweep, nodes: np.ndarray, rows: np.ndarray, started: list[int], left_out: dict[int, str]
) -> np.ndarray:
    """The untried `rows` of the node count the next trial is spent on: of the sizes still in play
    (not in `left_out`), the one with the fewest trials so far (`started`: plan rows done or running;
    the smaller on a tie). A sweep of one size: all of them. `nodes`: the plan's node count per row."""
    if not sweep.several_sizes:
        return rows
    count = Counter(int(nodes[r]) for r in started)
    live = [n for n in sweep.node_counts if n not in left_out and bool((nodes[rows] == n).any())]
    if not live:  # every size left out or spent: the rest, as one size's would be
        return rows
    n = min(live, key=lambda s: (count[s], s))
    return rows[nodes[rows] == n]


def sizes_out_of_play(
    sweep: Sweep,
    nodes: np.ndarray,
    measured: dict[int, float],
    model_step_s: np.ndarray,
    untried: np.ndarray,
    expected_step_s: np.ndarray,
) -> dict[int, str]:
    """The node counts that cannot win, with why: each size's best tokens/s as measured (`measured`:
    ok plan rows -> step seconds, `model_step_s` the model's for them in that order), or as its
    `untried` layouts are expected (`expected_step_s`: the recalibrated model and the residual),
    within the band the sweep's ok trials give the model (`PRIOR_BAND` before two of them)."""
    band = model_band(list(measured.values()), model_step_s.tolist()) if measured else None
    band = PRIOR_BAND if band is None else band
    work = sweep.global_batch_size * sweep.seq_len
    upper, lower = {}, {}
    for n in sweep.node_counts:
        seen = [work / t for r, t in measured.items() if nodes[r] == n]
        at = nodes[untried] == n
        guess = work / float(expected_step_s[at].min()) if at.any() else 0.0
        if not seen and not guess:
            continue  # nothing left to run there
        upper[n] = max([*seen, guess * (1 + band)])
        lower[n] = max(seen) if seen else guess * (1 - band)
    return out_of_play(upper, lower, sweep.cluster.gpus_per_node, sweep.goal)
