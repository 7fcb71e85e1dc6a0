"""Remembering sweeps: the prior a sweep starts from, and what its trials taught, for its learned profile.

The sweep loop (`sweeper.run.orchestrator`) asks `Memory.of` once, passes `prior` to the search, and
calls `keep` after every finished trial: a killed `sweep run` has kept what its finished trials
taught, and a resumed one replaces its own entry (the profile keeps one per sweep id). The file
is small (a few dozen numbers), so rewriting it per trial costs milliseconds against a trial's minutes.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.memfit import refit
from sweeper.estimate.step_time import Calibration
from sweeper.search.learned import LearnedKey, Lessons, MemoryLesson, load, nodes_of, save
from sweeper.search.prior import EffectKey, LearnedEffect, Prior, own_lessons
from sweeper.spec.hardware import GIB
from sweeper.spec.sweep import Sweep

if TYPE_CHECKING:  # importing this module must not import Optuna (the search)
    from sweeper.search.search import LayoutSearch


@dataclass(frozen=True)
class Memory:
    """The learned profile a sweep reads and writes (`enabled` False: neither)."""

    key: LearnedKey
    sweep_id: str
    enabled: bool
    prior: Prior | None

    @classmethod
    def of(cls, sweep: Sweep, *, sweep_id: str, cluster_name: str | None, enabled: bool) -> Memory:
        key = LearnedKey.of(sweep, cluster_name)
        profile = load(key) if enabled else None
        prior = profile.prior(exclude=sweep_id, nodes=nodes_of(sweep)) if profile is not None else None
        return cls(key, sweep_id, enabled, prior)

    def keep(self, search: LayoutSearch, *, trials: int) -> Path | None:
        """Save what the sweep's trials taught so far; None when disabled or nothing was measured yet."""
        if not self.enabled:
            return None
        found = lessons_of(search, sweep_id=self.sweep_id, trials=trials)
        if found is None:
            return None
        return save(self.key, found)


def lessons_of(search: LayoutSearch, *, sweep_id: str, trials: int) -> Lessons | None:
    """What the search's measured layouts taught on their own (not the prior it started from), or None."""
    learning, plan = search.learning, search.plan
    measured, peaks = learning.measured, learning.peaks
    if not measured and not peaks:
        return None
    sweep = plan.sweep
    cal: Calibration | None = None
    effects: dict[EffectKey, LearnedEffect] = {}
    if measured:
        rows = np.asarray(list(measured), dtype=np.int64)
        times = np.asarray([measured[int(r)] for r in rows])
        cal, effects = own_lessons(learning.model, plan.cols, rows, times, search.searched)
    memory = None
    if peaks:
        rows_p = list(peaks)
        fit = refit(plan.memory, rows_p, [peaks[r] for r in rows_p], [learning.reserved.get(r) for r in rows_p])
        memory = MemoryLesson(fit.act_scale, fit.offset_bytes / GIB, fit.reserved_factor, fit.points)
    return Lessons(
        sweep_id=sweep_id,
        name=sweep.name,
        model=sweep.model.name,
        nodes=sweep.cluster.nodes,
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        trials=trials,
        measured=len(measured),
        calibration=cal,
        effects=effects,
        memory=memory,
        host=socket.gethostname() or None,
        results=str(sweep.results_path.resolve()),
    )
