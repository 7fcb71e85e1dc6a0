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
from sweeper.hardware import GIB
from sweeper.knobs import KNOBS
from sweeper.layout import NO_EFFECT_VALUE, Layout, ineffective
from sweeper.learn import memory_scale, needs_at_least
from sweeper.perfmodel import Calibration, calibrate, predict
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


def tell_study(study: optuna.Study, trial: optuna.trial.Trial | int, *, status: str, value: float | None,
               attrs: dict[str, Any]) -> None:
    """Tell Optuna one outcome with its user attributes (status, error line, layout, job id, ...).

    A trial that ran and failed is stored as FAIL, so optuna-dashboard shows it as failed with its
    error. Optuna's samplers read only COMPLETE/PRUNED trials, so a proposal that is *not run*
    because it is known to be bad (rejected by the plan, excluded, or a repeat of a failed layout)
    is told COMPLETE at the failure objective with a violated constraint: TPE and GP rank it
    infeasible, below every measured layout, so a failed layout still counts as bad for them.
    """
    if isinstance(trial, int):  # resumed after a crash: only the number survives
        trial = optuna.trial.Trial(study, study._storage.get_trial_id_from_study_id_trial_number(
            study._study_id, trial))
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


def trial_attrs(layout: Layout | None, *, error: str | None = None, job_id: str | None = None,
                **extra: Any) -> dict[str, Any]:
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


class LayoutSearch:
    """Ask for new candidate layouts and tell their outcomes, over one Optuna study.

    `auto` (the default) runs every candidate, best predicted first, when they fit in the
    budget; otherwise it spends its first trials on the layouts the throughput model ranks
    highest, then alternates: TPE explores, the recalibrated model exploits. Every outcome teaches: an OOM excludes the layouts that
    need at least as much memory, measured step times recalibrate the throughput model,
    measured peaks above the estimate tighten the memory check.
    """

    def __init__(self, plan: Plan, study: optuna.Study, *, sampler: str, max_trials: int, seed: int = 0,
                 seed_trials: int | None = None, stop_margin: float | None = None) -> None:
        self.plan = plan
        self.study = study
        self.sweep = plan.sweep
        self.sampler = sampler
        self.rows = np.flatnonzero(plan.candidate_mask)
        self.searched = [k for k in KNOBS if len(self.sweep.space[k]) > 1]
        self.exhaustive = sampler == "grid" or (sampler == "auto" and len(self.rows) <= max_trials)
        self.seed_trials = (seed_trials if seed_trials is not None else min(8, max(3, max_trials // 5))
                            ) if sampler == "auto" else 0
        self.stop_margin = stop_margin
        self._rng = np.random.default_rng(seed)
        self._row_of_key = {self._key_of_row(int(r)): int(r) for r in self.rows}
        self.done: dict[int, float] = {}  # plan row -> objective told
        self.outcome: dict[int, str] = {}  # plan row -> trial status
        self.running: set[int] = set()
        self.excluded: dict[int, str] = {}  # candidate rows ruled out by what trials taught
        self.model = predict(plan.cols, self.sweep)
        self.calibration = Calibration()
        self.pred_mfu = self.model.mfu
        self._measured: dict[int, float] = {}  # plan row -> measured step time
        self._peaks: dict[int, float] = {}  # plan row -> measured peak GiB (GPU runs only)

    # ---- identity of layouts ---------------------------------------------------------
    def _key_of_row(self, row: int) -> tuple:
        cols = {k: v[row : row + 1] for k, v in self.plan.cols.items()}
        return _canonical_key(cols)

    def row_of(self, layout: Layout) -> int | None:
        """The candidate row that runs this layout (itself or its equivalent), or None if rejected."""
        return self._row_of_key.get(_canonical_key(layout.columns(self.sweep)))

    # ---- ask / tell ------------------------------------------------------------------
    def untried(self) -> list[int]:
        return [int(r) for r in self.rows if r not in self.done and r not in self.running and r not in self.excluded]

    def remaining(self) -> int:
        return len(self.untried())

    def ask(self, *, max_rejections: int = 200) -> Proposal | None:
        """The next new candidate, or None when every candidate has been tried, runs or is excluded."""
        untried = self.untried()
        if not untried:
            return None
        if self.sampler == "grid":
            return self._ask_enqueued(untried[0])
        started = len(self.done) + len(self.running)
        # seed trials, then every other trial: the calibrated model's best untried layout
        if self.exhaustive or started < self.seed_trials or (self.sampler == "auto" and started % 2 == 0):
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
                tell_study(self.study, trial, status=status, value=None, attrs=trial_attrs(
                    layout, kind="rejected", reason=reason or (why.message if why else "pruned: predicted memory over the card")))
            elif row in self.done:
                tell_study(self.study, trial, status=self.outcome.get(row, TrialStatus.OK), value=self.done[row],
                           attrs=trial_attrs(layout, kind="repeat"))
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

    def observe(self, row: int, *, status: str, mfu: float | None, step_time_s: float | None = None,
                peak_mem_gib: float | None = None, device: str | None = None) -> float:
        """Learn from a finished trial (also from an earlier run's rows); returns its objective."""
        value = mfu if (status == "ok" and mfu is not None) else FAILED_OBJECTIVE
        self.running.discard(row)
        self.excluded.pop(row, None)
        self.done[row] = value
        self.outcome[row] = status
        if status == "oom":
            self._exclude_hungrier(row)
        if status == "ok" and step_time_s:
            self._measured[row] = step_time_s
            self._recalibrate()
        if status == "ok" and peak_mem_gib and device and not device.startswith("cpu"):
            self._peaks[row] = peak_mem_gib
            self._tighten_memory()
        return value

    def tell(self, optuna_trial: int, row: int, *, status: str, mfu: float | None,
             attrs: dict[str, Any] | None = None, **measured: object) -> None:
        """Record a finished trial: MFU when it ran, FAIL otherwise; `attrs` (error, job id) as user attributes."""
        value = self.observe(row, status=status, mfu=mfu, **measured)  # type: ignore[arg-type]
        try:
            tell_study(self.study, optuna_trial, status=status, value=value,
                       attrs=trial_attrs(self.plan.layout(row)) | (attrs or {}))
        except (ValueError, RuntimeError, KeyError):
            pass  # the trial was already finished in the study (e.g. told before a crash)

    def should_stop(self) -> bool:
        """With a stop margin: no untried layout can beat the best by more than it (calibrated model)."""
        ok = [v for v in self.done.values() if v > 0]
        if self.stop_margin is None or len(self._measured) < 3 or not ok:
            return False
        untried = self.untried()
        return not untried or float(np.max(self.pred_mfu[untried])) < max(ok) * (1 + self.stop_margin)

    # ---- learning --------------------------------------------------------------------
    def _exclude_hungrier(self, oom_row: int) -> None:
        untried = np.asarray(self.untried(), dtype=int)
        if untried.size == 0:
            return
        hit = untried[needs_at_least(self.plan.cols, untried, oom_row)]
        for r in hit:
            self.excluded[int(r)] = f"needs at least the memory of a layout that ran out of memory (plan row {oom_row})"

    def _recalibrate(self) -> None:
        rows = list(self._measured)
        self.calibration = calibrate(self.model, rows, [self._measured[r] for r in rows])
        scale = self.model.total / np.maximum(
            self.calibration.compute_scale * self.model.compute + self.calibration.comm_scale * self.model.comm, 1e-12)
        self.pred_mfu = self.model.mfu * scale

    def _tighten_memory(self) -> None:
        mem = self.plan.memory
        tensors = (mem.total - mem.overhead) / GIB
        rows = list(self._peaks)
        k = memory_scale([float(tensors[r]) for r in rows], [self._peaks[r] for r in rows])
        if k <= 1.0:
            return
        over = (tensors * k + mem.overhead / GIB) * GIB > mem.capacity_bytes
        for r in self.untried():
            if over[r]:
                self.excluded[r] = f"measured peaks run {k:.2f}x the estimate: this layout would not fit"

    def abandon(self, optuna_trial: int) -> None:
        """A trial that will not report (vanished, or interrupted before it was submitted)."""
        try:
            self.study.tell(optuna_trial, state=TrialState.FAIL)
        except (ValueError, RuntimeError, KeyError):
            pass

    def fail_stale_running(self, keep: set[int]) -> int:
        """Optuna trials left RUNNING by an earlier process and not re-attached: mark them failed."""
        stale = [t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                 if t.number not in keep]
        for n in stale:
            self.abandon(n)
        return len(stale)

    def _layout(self, values: dict[str, Any]) -> Layout:
        fixed = {k: self.sweep.space[k][0] for k in KNOBS if k not in self.searched}
        return Layout.from_mapping(fixed | values)


def _canonical_key(cols: dict[str, np.ndarray]) -> tuple:
    noop = ineffective(cols)
    return tuple(
        NO_EFFECT_VALUE[k] if (k in noop and bool(noop[k][0])) else _python(cols[k][0]) for k in KNOBS
    )


def _python(v: Any) -> Any:
    return v.item() if isinstance(v, np.generic) else v
