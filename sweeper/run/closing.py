"""What `sweep run` says when its loop ends, beside the best layouts: why the search stopped short of
its trial budget (the answer settled, or the GPU-hour budget), and the GPU-hours the trials took."""

from __future__ import annotations

import numpy as np

from sweeper.run.state import SweepRun
from sweeper.run.unwritten import not_written
from sweeper.search.budget import spent_line
from sweeper.search.sizes import MARGIN, SETTLED


def closing_notes(run: SweepRun) -> list[str]:
    """Why the search stopped before its trial budget, if it did, and the GPU-hours spent (with a
    GPU-hour budget or over several node counts)."""
    search, budget, notes = run.search, run.sweep.search.max_gpu_hours, []
    if search.settled and not run.running:
        notes.append(
            f"the answer is settled within noise: no untried layout of any node count in play has a "
            f"{SETTLED:.0%} chance to beat it by {MARGIN:.0%} (sweeper/search/sizes.py)"
        )
    if search.over_budget and budget is not None:
        untried = np.asarray(search.untried(), dtype=np.int64)
        cheapest = float(search.trial_gpu_hours(untried).min()) if untried.size else 0.0
        notes.append(
            f"search.max_gpu_hours {budget:g}: no trial started that would overrun it; the cheapest untried "
            f"layout's trial is expected to take {cheapest:.3g} GPU-hours, {max(run.gpu_hours_left() or 0.0, 0.0):.3g} are left"
        )
    if budget is not None or run.sweep.several_sizes:
        told = [r for r in run.rows if not not_written(r)]
        notes.append(spent_line(told, run.sweep.cluster.gpus_per_node, run.sweep.trial, search.startup_s, budget))
    return notes
