"""The state of one `sweep run`: the sweep, its plan, study and launcher, and the trials in flight.

Read by the loop (`orchestrator`) and by what it does with a trial's outcome (`slow_trials`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sweeper.launchers.base import Handle, Launcher
from sweeper.plan.plan import Plan
from sweeper.results.rows import InFlight, ResultsStore
from sweeper.run.unwritten import not_written
from sweeper.search.budget import spent_gpu_hours
from sweeper.search.remember import Memory
from sweeper.search.search import LayoutSearch
from sweeper.spec.sweep import Sweep


@dataclass
class Running:
    handle: Handle
    record: InFlight


@dataclass
class SweepRun:
    """The state of one `sweep run`: plan, study, launcher, and the trials in flight."""

    sweep: Sweep
    plan: Plan
    store: ResultsStore
    search: LayoutSearch
    launcher: Launcher
    spec_path: Path
    running: dict[int, Running] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    stop_requested: bool = False
    identity: str = ""  # sweeper.results.identity.sweep_identity, written into every row
    notes: list[str] = field(default_factory=list)  # what the run did that the user should know
    fatal: str | None = None  # why the sweep stopped on its own (this machine cannot run any trial)
    warnings: list[str] = field(default_factory=list)
    spec_digest: str = (
        ""  # of the recorded sweep file, checked before each trial starts (results.frozen.check_unchanged)
    )
    memory: Memory | None = None  # the learned profile it started from and keeps what it learns in

    @property
    def budget(self) -> int:
        return self.sweep.search.max_trials

    @property
    def gpu_hours_spent(self) -> float:
        """GPU-hours the finished trials took (`sweeper.search.budget.spent_gpu_hours`), this run's and earlier runs'."""
        told = [r for r in self.rows if not not_written(r)]
        return spent_gpu_hours(told, self.sweep.cluster.gpus_per_node, self.sweep.trial, self.search.startup_s)

    def gpu_hours_left(self) -> float | None:
        """What `search.max_gpu_hours` leaves for new trials: the budget less what the finished trials
        took and what the running ones are expected to take (None without a budget)."""
        budget = self.sweep.search.max_gpu_hours
        if budget is None:
            return None
        rows = np.asarray([r.record.row for r in self.running.values()], dtype=np.int64)
        running = float(self.search.trial_gpu_hours(rows).sum()) if rows.size else 0.0
        return budget - self.gpu_hours_spent - running

    @property
    def launched(self) -> int:
        # a trial the full disk kept from writing its result does not spend the budget: it runs again
        return sum(not not_written(r) for r in self.rows) + len(self.running)
