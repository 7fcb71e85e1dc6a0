"""Launchers: where trials run. submitit is imported only by the SLURM launcher."""

from __future__ import annotations

from sweeper.launchers.base import Handle, JobOutcome, Launcher, LauncherProfile, TrialJob
from sweeper.launchers.profiles import resolve_profile
from sweeper.launchers.registry import launcher_classes
from sweeper.spec import Sweep

__all__ = [
    "Handle",
    "Launcher",
    "LauncherProfile",
    "JobOutcome",
    "TrialJob",
    "launcher_classes",
    "make_launcher",
    "resolve_profile",
]


def make_launcher(sweep: Sweep) -> Launcher:
    """The launcher the sweep file asks for, configured from its profile."""
    profile = resolve_profile(sweep)
    return launcher_classes()[profile.kind].from_profile(profile, sweep)
