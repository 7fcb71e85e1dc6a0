"""What every launcher does: submit a trial, poll it, cancel it, re-attach to it after a restart.

A launcher is one class with its profile model (the `launcher:` mapping of a sweep file or a file
under launchers/): `sweeper.launchers.registry` finds it by its `kind`, and tests/launchers/test_contract.py
runs the same operations against each.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, StringConstraints

from sweeper.layouts.layout import Columns, Layout
from sweeper.results.trial import TrialResult
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus

# Values that end up on a job script's line or in a scheduler's request: no spaces, quotes or shell
# metacharacters; option names in lower case.
SafeToken = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.,:=/+@%-]*$", max_length=256)]
OptionName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]


# A trial enforces its own time limit (its ranks are killed at it); this grace covers its start-up and
# teardown before a launcher ends the trial itself (a local process group, a torchx app).
KILL_GRACE_S = 60.0


@dataclass(frozen=True)
class TrialJob:
    """One trial to run: the layout of a sweep, where its files go, and its time limit."""

    number: int
    layout: Layout
    spec_path: Path  # the sweep file as frozen in the results folder
    workdir: Path  # per-trial folder for logs and the result file
    timeout_s: float
    attempt: int = 1
    nodes: int | None = None  # the layout's node count in a sweep over several (None: the cluster's)


@dataclass
class Handle:
    """A submitted trial. `job_id` is persisted the moment it is known, for re-attach."""

    job_id: str
    job: TrialJob
    native: Any = None  # the launcher's own object (a Popen, a submitit job)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobOutcome:
    """What came back from a launcher: the trial's result and where it ran.

    Launchers read what a trial wrote (its JSON) with `TrialResult.from_dict`.
    """

    result: TrialResult
    job_id: str
    nodelist: str | None = None
    log_path: str | None = None
    infrastructure_failure: bool = False  # the job died around the trial (killed, node lost): retry once


class LauncherProfile(BaseModel):
    """A launcher's settings as a sweep file or a profile under launchers/ gives them.

    A subclass declares `kind: Literal["<its launcher's kind>"]` and its own fields.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str  # the registry's key: a subclass narrows it to its launcher's `Literal` kind

    # Fields only a profile file under launchers/ (site configuration) may set, never a sweep
    # file's inline mapping: a sweep file is shared and copied, and must not add job-script lines.
    site_only: ClassVar[tuple[str, ...]] = ()

    def check(self, source: str) -> None:
        """Checks across fields, after validation; raise `SpecError` naming `source`."""

    def site_only_settings(self) -> list[str]:
        """The settings given here that only a site profile may give (refused in a sweep file's inline
        launcher): the `site_only` fields set, and whatever a subclass adds by value (a run option)."""
        return [name for name in self.site_only if name in self.model_fields_set]

    def cluster_name(self) -> str | None:
        """The machine the trials run on, where the profile names one (a SLURM partition): the cluster
        of the sweep's learned profile (`sweeper.search.learned.LearnedKey`). None: not named."""
        return None


class Launcher(ABC):
    """A place where trials run. Subclasses: local processes, SLURM jobs, a replayed table."""

    kind: str = "base"
    poll_s: float = 0.25  # how often the sweep loop polls this launcher
    # The model of this launcher's profile; a class with one is registered under `kind`.
    profile_model: ClassVar[type[LauncherProfile] | None] = None
    cannot_run_reason: ClassVar[str] = "the launcher cannot run it"  # the plan's reason for `cannot_run`'s layouts
    # Whether its trials measure the sweep's cluster here and now, so that what they teach is kept in the
    # cluster's learned profile and earlier lessons apply (`search.learned_profile` decides when set).
    measures_here: ClassVar[bool] = True
    # A trial's start-up when none of this sweep's trials measured one (the dry run's estimate says
    # which it used): a job's start on its nodes, the processes' launch, NCCL and the model's build
    default_startup_s: ClassVar[float] = 120.0
    default_startup_why: ClassVar[str] = "assumed for a job on a cluster: queue start, launch, NCCL, model build"
    runs_steps: ClassVar[bool] = True  # False: a trial's answer costs no steps (a replay reads a table)

    @classmethod
    def from_profile(cls, profile: LauncherProfile, sweep: Sweep) -> Launcher:
        """The launcher a validated profile asks for; refuse (`SpecError`) a sweep it cannot run."""
        raise NotImplementedError(f"{cls.__name__} must say how a profile makes it (from_profile)")

    @abstractmethod
    def submit(self, job: TrialJob) -> Handle:
        """Start the trial; return at once with its job id."""

    @abstractmethod
    def poll(self, handle: Handle) -> JobOutcome | None:
        """The outcome when the trial has ended, else None. Never blocks for long."""

    @abstractmethod
    def cancel(self, handle: Handle) -> None:
        """Stop the trial and everything it started."""

    @abstractmethod
    def reattach(self, job_id: str, job: TrialJob) -> Handle | None:
        """Find a trial submitted by an earlier `sweep run`; None when it is gone."""

    def cannot_run(self, cols: Columns) -> np.ndarray:
        """Mask over the layouts of `cols` (plan columns): those this launcher cannot run whatever the
        trainer can, which the plan leaves out (reason `launcher_cannot_run`) so the search never
        proposes them. Default: none, as a cluster runs every layout its trainer runs; a replay
        table answers only the layouts it holds."""
        return np.zeros(len(cols["tp"]), dtype=bool)

    def cluster_name(self) -> str | None:
        """The machine its trials run on, where its profile names one (`LauncherProfile.cluster_name`)."""
        return None

    def find(self, job: TrialJob) -> str | None:
        """The job id of `job` when it was started but its id never recorded (a `sweep run` killed
        between the two); None when it cannot be found. Default: cannot look."""
        return None

    def end_strays(self, jobs_dir: Path, known: set[Path]) -> list[str]:
        """End trial processes under `jobs_dir` that no in-flight record names; their job ids."""
        return []

    def close(self) -> None:
        """Let go of what the launcher keeps for its sweep's trials (the local one: a warm fork server);
        trials in flight keep running. Default: nothing kept."""
        return None


def failure(status: TrialStatus, error: str, job: TrialJob) -> TrialResult:
    """The result of a trial that produced no result of its own."""
    return TrialResult(status=status, error=error, **job.layout.as_dict())


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log file, for error messages ('' when it does not exist)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])
