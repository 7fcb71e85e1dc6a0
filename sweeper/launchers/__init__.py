"""Launchers: where trials run. submitit is imported only by the SLURM launcher.

May import: foundation, profiles, spec, layouts, estimate, trainers, plan, results, runtime.
"""

from __future__ import annotations

from sweeper.launchers.base import Handle, JobOutcome, Launcher, LauncherProfile, TrialJob
from sweeper.launchers.profiles import resolve_profile
from sweeper.launchers.registry import launcher_classes
from sweeper.plan.plan import Plan, leave_out
from sweeper.spec.sweep import Sweep

__all__ = [
    "Handle",
    "Launcher",
    "LauncherProfile",
    "JobOutcome",
    "TrialJob",
    "launcher_classes",
    "make_launcher",
    "plan_for_launcher",
    "resolve_profile",
]


def make_launcher(sweep: Sweep) -> Launcher:
    """The launcher the sweep file asks for, configured from its profile."""
    profile = resolve_profile(sweep)
    return launcher_classes()[profile.kind].from_profile(profile, sweep)


def plan_for_launcher(plan: Plan) -> Plan:
    """The plan less the layouts the sweep's launcher cannot run (`Launcher.cannot_run`), as `sweep run`
    plans it; for `--dry-run`, which starts nothing: only a launcher that can refuse a layout (a
    replay, which reads its table) is built, a cluster launcher never is."""
    profile = resolve_profile(plan.sweep)
    cls = launcher_classes()[profile.kind]
    if cls.cannot_run is Launcher.cannot_run:
        return plan
    launcher = cls.from_profile(profile, plan.sweep)
    return leave_out(plan, launcher.cannot_run, launcher.cannot_run_reason)
