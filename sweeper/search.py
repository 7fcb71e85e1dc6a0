"""The search: an Optuna study over the plan's candidate layouts, asked and told one trial at a time.

Optuna samples one categorical parameter per searched knob. A proposal that the planner
rejected is told back at once (objective 0, so model-based samplers learn to avoid the region)
and never run; a proposal equal to a finished layout is told its known result. Only new
candidates leave `ask`, so no trial is ever spent on a rejected or repeated layout.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from sweeper.errors import SweepError
from sweeper.knobs import KNOBS
from sweeper.layout import Layout
from sweeper.learn import Learning
from sweeper.perfmodel import Calibration, StepTime
from sweeper.plan import Plan
from sweeper.statuses import PlanStatus, TrialStatus

SAMPLERS = ("auto", "grid", "random", "tpe", "gp")
FAILED_OBJECTIVE = 0.0  # what a failed, OOM or rejected layout is worth to the sampler (MFU 0)
METRIC = "mfu"  # the objective's name in the study (optuna-dashboard's axis label)


@dataclass(frozen=True)
class Proposal:
    """A new candidate to run: the Optuna trial that proposed it and the plan row."""

    optuna_trial: int
    row: int
    layout: Layout


def open_study(storage: str, name: str, *, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """Create or load the sweep's study (maximising MFU) in an Optuna storage URL."""
    optuna.logging.set_verbosity(logging.WARNING)
    if storage.endswith(".journal") or storage.startswith("journal:"):
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        path = storage.removeprefix("journal:")
        store: Any = JournalStorage(JournalFileBackend(path))
    else:
        store = storage
    try:
        study = optuna.create_study(
            study_name=name, storage=store, direction="maximize", sampler=sampler, load_if_exists=True
        )
        if study.metric_names != [METRIC]:
            with warnings.catch_warnings():  # experimental since Optuna 3.2, stable in use
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names([METRIC])
        return study
    except (ValueError, ImportError, optuna.exceptions.OptunaError) as e:
        raise SweepError(f"search.storage {storage!r}: cannot open the Optuna study: {e}") from None


def is_exhaustive(sampler: str, n_candidates: int, max_trials: int) -> bool:
    """Whether the search runs every candidate (grid always; auto when they fit in the budget)."""
    return sampler == "grid" or (sampler == "auto" and n_candidates <= max_trials)


def build_search(
    plan: Plan,
    *,
    storage: str | None = None,
    study_name: str | None = None,
    sampler: str | None = None,
    max_trials: int | None = None,
    seed: int | None = None,
) -> LayoutSearch:
    """The search of a plan: its sampler, its study (in `storage`, or in memory when None), its policy.

    The one constructor the orchestrator, the benchmarks and the tests use; settings not given
    come from the sweep's `search` section.
    """
    settings = plan.sweep.search
    sampler = sampler or settings.sampler
    max_trials = settings.max_trials if max_trials is None else max_trials
    seed = settings.seed if seed is None else seed
    exhaustive = is_exhaustive(sampler, int(plan.candidate_mask.sum()), max_trials)
    optuna_sampler = make_sampler(sampler, seed=seed, exhaustive=exhaustive, budget=max_trials)
    name = study_name or plan.sweep.name
    if storage is None:
        optuna.logging.set_verbosity(logging.WARNING)
        study = optuna.create_study(study_name=name, direction="maximize", sampler=optuna_sampler)
    else:
        study = open_study(storage, name, sampler=optuna_sampler)
    return LayoutSearch(
        plan,
        study,
        sampler=sampler,
        max_trials=max_trials,
        seed=seed,
        seed_trials=settings.seed_trials,
        stop_margin=settings.stop_margin,
    )


def tell_study(
    study: optuna.Study, trial: optuna.trial.Trial | int, *, status: str, value: float | None, attrs: dict[str, Any]
) -> None:
    """Tell Optuna one outcome with its user attributes (status, error line, layout, job id, ...).

    A trial that ran and failed is stored as FAIL, so optuna-dashboard shows it as failed with its
    error. Optuna's samplers read only COMPLETE/PRUNED trials, so a proposal that is *not run*
    because it is known to be bad (rejected by the plan, excluded, or a repeat of a failed layout)
    is told COMPLETE at the failure objective with a violated constraint: TPE and GP rank it
    infeasible, below every measured layout, so a failed layout still counts as bad for them.
    """
    if isinstance(trial, int):  # resumed after a crash: only the number survives
        trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, trial)
        if study._storage.get_trial(trial_id).state.is_finished():
            return  # told before the crash: nothing left to say (Optuna's skip_if_finished)
        trial = optuna.trial.Trial(study, trial_id)
    for key, v in (attrs | {"status": str(status)}).items():
        trial.set_user_attr(key, v)
    ran = attrs.get("kind") is None
    if status == TrialStatus.OK and value is not None:
        study.tell(trial, value)
    elif ran:
        study.tell(trial, state=TrialState.FAIL)
    else:
        trial.set_constraint("failed", 1.0)
        study.tell(trial, FAILED_OBJECTIVE)


def trial_attrs(
    layout: Layout | None, *, error: str | None = None, job_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The user attributes of a told trial: the layout's knobs, the error's first line, the job id."""
    attrs: dict[str, Any] = dict(extra)
    if layout is not None:
        attrs["layout"] = " ".join(f"{k}={_python(v)}" for k, v in layout.as_dict().items())
    lines = (error or "").strip().splitlines()
    if lines:
        attrs["error"] = lines[0][:500]
    if job_id:
        attrs["job_id"] = str(job_id)
    return attrs


def make_sampler(name: str, *, seed: int, exhaustive: bool, budget: int) -> optuna.samplers.BaseSampler:
    """The sampler for search.sampler; the exhaustive path enqueues every candidate itself."""
    if name == "grid" or (name == "auto" and exhaustive) or name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name in ("tpe", "auto"):
        startup = max(2, min(10, budget // 4))
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=True, n_startup_trials=startup)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=max(2, min(10, budget // 4)))
    raise SweepError(f"search.sampler: {name!r} not allowed; allowed: {', '.join(SAMPLERS)}")


@dataclass(frozen=True)
class Schedule:
    """The scheduling policy: which trials take the model's best untried layout, which the sampler's.

    grid: every candidate in plan order. Exhaustive (grid, or auto within the budget): every
    candidate, best predicted first. auto otherwise: the first `seed_trials` from the model,
    then every other trial. tpe, gp, random: the sampler alone.
    """

    sampler: str
    exhaustive: bool
    seed_trials: int

    @classmethod
    def of(cls, sampler: str, *, n_candidates: int, max_trials: int, seed_trials: int | None = None) -> Schedule:
        default_seed = min(8, max(3, max_trials // 5))
        seeds = (seed_trials if seed_trials is not None else default_seed) if sampler == "auto" else 0
        return cls(sampler, is_exhaustive(sampler, n_candidates, max_trials), seeds)

    @property
    def in_plan_order(self) -> bool:
        return self.sampler == "grid"

    def exploit(self, *, started: int) -> bool:
        """Whether the next trial (after `started` ones) runs the calibrated model's best untried layout."""
        return self.exhaustive or started < self.seed_trials or (self.sampler == "auto" and started % 2 == 0)


class LayoutSearch:
    """Ask for new candidate layouts and tell their outcomes, over one Optuna study.

    `auto` (the default) runs every candidate, best predicted first, when they fit in the
    budget; otherwise it spends its first trials on the layouts the throughput model ranks
    highest, then alternates: TPE explores, the recalibrated model exploits. Every outcome teaches: an OOM excludes the layouts that
    need at least as much memory, measured step times recalibrate the throughput model,
    measured peaks refit the memory estimate both ways, a layout that ran re-admits the pruned
    layouts that need no more memory, and a clearly faster layout just over the card gets a
    probe trial (`sweeper.memfit`).
    """

    def __init__(
        self,
        plan: Plan,
        study: optuna.Study,
        *,
        sampler: str,
        max_trials: int,
        seed: int = 0,
        seed_trials: int | None = None,
        stop_margin: float | None = None,
    ) -> None:
        self.plan = plan
        self.study = study
        self.sweep = plan.sweep
        self.sampler = sampler
        self.rows = np.flatnonzero(plan.candidate_mask)
        self.searched = [k for k in KNOBS if len(self.sweep.space[k]) > 1]
        self.policy = Schedule.of(sampler, n_candidates=len(self.rows), max_trials=max_trials, seed_trials=seed_trials)
        self.stop_margin = stop_margin
        self._rng = np.random.default_rng(seed)
        self.done: dict[int, float] = {}  # plan row -> objective told
        self.outcome: dict[int, str] = {}  # plan row -> trial status
        self.running: set[int] = set()
        self.learning = Learning(plan)
        if not self.policy.in_plan_order:  # grid runs the plan as planned
            self.learning.add_probes()

    # What the trials taught, as the rest of the code and the tests read it.
    @property
    def exhaustive(self) -> bool:
        return self.policy.exhaustive

    @property
    def excluded(self) -> dict[int, str]:
        return self.learning.excluded

    @property
    def pred_mfu(self) -> np.ndarray:
        return self.learning.pred_mfu

    @property
    def calibration(self) -> Calibration:
        return self.learning.calibration

    @property
    def model(self) -> StepTime:
        return self.learning.model

    def row_of(self, layout: Layout) -> int | None:
        """The plan row that runs this layout: a candidate, or a pruned layout the trials re-admitted."""
        row = self.plan.row_of(layout)
        if row is None:
            valid = self.plan.row_of(layout, pruned=True)
            row = valid if valid in self.learning.readmitted else None
        return row

    # ---- ask / tell ------------------------------------------------------------------
    def untried(self) -> list[int]:
        pool = [*self.rows.tolist(), *(r for r in self.learning.readmitted if not self.plan.candidate_mask[r])]
        return [int(r) for r in pool if r not in self.done and r not in self.running and r not in self.excluded]

    def remaining(self) -> int:
        return len(self.untried())

    def ask(self, *, max_rejections: int = 200) -> Proposal | None:
        """The next new candidate, or None when every candidate has been tried, runs or is excluded."""
        untried = self.untried()
        if not untried:
            return None
        if self.policy.in_plan_order:
            return self._ask_enqueued(untried[0])
        if self.policy.exploit(started=len(self.done) + len(self.running)):
            return self._ask_enqueued(max(untried, key=lambda r: self.pred_mfu[r]))
        for _ in range(max_rejections):
            trial = self.study.ask()
            values = {k: trial.suggest_categorical(k, list(self.sweep.space[k])) for k in self.searched}
            layout = self._layout(values)
            row = self.row_of(layout)
            if row is None or row in self.excluded:
                why = layout.rejection(self.sweep)
                reason = self.excluded.get(row) if row is not None else None
                status = PlanStatus.INVALID if why else PlanStatus.PRUNED
                tell_study(
                    self.study,
                    trial,
                    status=status,
                    value=None,
                    attrs=trial_attrs(
                        layout,
                        kind="rejected",
                        reason=reason or (why.message if why else "pruned: predicted memory over the card"),
                    ),
                )
            elif row in self.done:
                tell_study(
                    self.study,
                    trial,
                    status=self.outcome.get(row, TrialStatus.OK),
                    value=self.done[row],
                    attrs=trial_attrs(layout, kind="repeat"),
                )
            elif row in self.running:
                trial.set_user_attr("kind", "repeat")
                self.study.tell(trial, state=TrialState.FAIL)
            else:
                self.running.add(row)
                return Proposal(trial.number, row, self.plan.layout(row))
        # the sampler keeps proposing what is known: take an untried candidate at random
        return self._ask_enqueued(int(self._rng.choice(self.untried())))

    def _ask_enqueued(self, row: int) -> Proposal:
        params = {k: _python(self.plan.cols[k][row]) for k in self.searched}
        self.study.enqueue_trial(params, skip_if_exists=False)
        trial = self.study.ask()
        for k in self.searched:
            trial.suggest_categorical(k, list(self.sweep.space[k]))
        self.running.add(row)
        return Proposal(trial.number, row, self.plan.layout(row))

    def observe(
        self,
        row: int,
        *,
        status: str,
        mfu: float | None,
        step_time_s: float | None = None,
        peak_mem_gib: float | None = None,
        device: str | None = None,
        peak_mem_reserved_gib: float | None = None,
    ) -> float:
        """Learn from a finished trial (also from an earlier run's rows); returns its objective."""
        status = TrialStatus(status)
        value = mfu if (status.succeeded() and mfu is not None) else FAILED_OBJECTIVE
        self.running.discard(row)
        self.excluded.pop(row, None)
        self.done[row] = value
        self.outcome[row] = status
        if status.is_oom():
            self.learning.learn_oom(row, self.untried())
        if status.succeeded() and step_time_s:
            self.learning.learn_step_time(row, step_time_s)
        device_peak = bool(device) and not str(device).startswith("cpu")  # CPU RSS growth is no allocator peak
        if status.succeeded() and device_peak and (peak_mem_gib or peak_mem_reserved_gib):
            self.learning.learn_peak(
                row, peak_mem_gib, peak_mem_reserved_gib, self.untried(), busy=self.done.keys() | self.running
            )
        if status.succeeded():
            self.learning.learn_ran(row, done=self.done.keys())
        return value

    def tell(
        self,
        optuna_trial: int,
        row: int,
        *,
        status: str,
        mfu: float | None,
        attrs: dict[str, Any] | None = None,
        **measured: object,
    ) -> None:
        """Record a finished trial: MFU when it ran, FAIL otherwise; `attrs` (error, job id) as user attributes."""
        value = self.observe(row, status=status, mfu=mfu, **measured)  # type: ignore[arg-type]
        tell_study(
            self.study,
            optuna_trial,
            status=status,
            value=value,
            attrs=trial_attrs(self.plan.layout(row)) | (attrs or {}),
        )

    def should_stop(self) -> bool:
        """With a stop margin: no untried layout can beat the best by more than it (calibrated model)."""
        ok = [v for v in self.done.values() if v > 0]
        if self.stop_margin is None or len(self.learning.measured) < 3 or not ok:
            return False
        untried = self.untried()
        return not untried or float(np.max(self.pred_mfu[untried])) < max(ok) * (1 + self.stop_margin)

    def abandon(self, optuna_trial: int) -> None:
        """A trial that will not report (vanished, or interrupted before it was submitted)."""
        self.study.tell(optuna_trial, state=TrialState.FAIL, skip_if_finished=True)

    def fail_stale_running(self, keep: set[int]) -> int:
        """Optuna trials left RUNNING by an earlier process and not re-attached: mark them failed."""
        stale = [
            t.number
            for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if t.number not in keep
        ]
        for n in stale:
            self.abandon(n)
        return len(stale)

    def _layout(self, values: dict[str, Any]) -> Layout:
        fixed = {k: self.sweep.space[k][0] for k in KNOBS if k not in self.searched}
        return Layout.from_mapping(fixed | values)


def _python(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
