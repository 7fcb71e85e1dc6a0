"""Launchers: where trials run. submitit is imported only by the SLURM launcher."""

from __future__ import annotations

from pathlib import Path

from sweeper.launchers.base import Handle, JobOutcome, Launcher, TrialJob
from sweeper.launchers.profiles import LocalProfile, ReplayProfile, SlurmProfile, check_local_capacity, resolve_profile
from sweeper.spec import Sweep

__all__ = ["Handle", "Launcher", "JobOutcome", "TrialJob", "make_launcher", "resolve_profile"]


def make_launcher(sweep: Sweep) -> Launcher:
    """The launcher the sweep file asks for, configured from its profile."""
    profile = resolve_profile(sweep)
    if isinstance(profile, LocalProfile):
        from sweeper.launchers.local import LocalLauncher

        check_local_capacity(sweep)
        return LocalLauncher()
    if isinstance(profile, ReplayProfile):
        from sweeper.launchers.replay import ReplayLauncher

        table = Path(profile.table)
        if not table.is_absolute() and sweep.source is not None:
            table = Path(sweep.source).parent / table
        return ReplayLauncher(table, sweep)
    assert isinstance(profile, SlurmProfile)
    from sweeper.launchers.slurm import SlurmLauncher

    return SlurmLauncher(profile, sweep)
