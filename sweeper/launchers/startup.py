"""A trial's start-up for the dry run's estimate, from what is known: the median `startup_s` this
sweep's finished trials measured on its launcher, else the launcher kind's default (none for a
replay, which answers from its table), with where the figure came from."""

from __future__ import annotations

import statistics

from sweeper.errors import SweepError
from sweeper.launchers.profiles import resolve_profile
from sweeper.launchers.registry import launcher_classes
from sweeper.plan.summary import TrialStartup
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus


def trial_startup(sweep: Sweep) -> TrialStartup:
    """This sweep's trial start-up on its launcher, and its source."""
    cls = launcher_classes()[resolve_profile(sweep).kind]
    if not cls.runs_steps:
        return TrialStartup(cls.default_startup_s, cls.default_startup_why, runs_steps=False)
    measured = _measured(sweep, cls.kind)
    if measured:
        return TrialStartup(
            statistics.median(measured), f"the median of this sweep's {len(measured)} finished trial(s) on {cls.kind}"
        )
    return TrialStartup(cls.default_startup_s, cls.default_startup_why)


def _measured(sweep: Sweep, kind: str) -> list[float]:
    """The start-up of this sweep's ok trials on launcher `kind` (none without a results folder)."""
    from sweeper.results.rows import ResultsStore

    trials = sweep.results_path / "trials"
    if not trials.is_dir():
        return []
    try:
        rows = ResultsStore(sweep.results_path).rows()
    except (OSError, SweepError):  # the estimate falls back to the default; `run` says what is wrong
        return []
    return [
        float(r["startup_s"])
        for r in rows
        if r.get("status") == TrialStatus.OK and r.get("launcher") == kind and _positive(r.get("startup_s"))
    ]


def _positive(v: object) -> bool:
    return isinstance(v, (int, float)) and v == v and v > 0
