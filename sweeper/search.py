"""The search: an Optuna study over the plan's candidate layouts, asked and told one trial at a time.

Optuna samples one categorical parameter per searched knob. A proposal that the planner
rejected is told back at once (objective 0, so model-based samplers learn to avoid the region)
and never run; a proposal equal to a finished layout is told its known result. Only new
candidates leave `ask`, so no trial is ever spent on a rejected or repeated layout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.trial import TrialState

from sweeper.errors import SweepError
from sweeper.knobs import KNOBS
from sweeper.layout import NO_EFFECT_VALUE, Layout, ineffective
from sweeper.plan import Plan

SAMPLERS = ("auto", "grid", "random", "tpe", "gp")
FAILED_OBJECTIVE = 0.0  # what a failed, OOM or rejected layout is worth to the sampler (MFU 0)


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
        return optuna.create_study(
            study_name=name, storage=store, direction="maximize", sampler=sampler, load_if_exists=True
        )
    except (ValueError, ImportError, optuna.exceptions.OptunaError) as e:
        raise SweepError(f"search.storage {storage!r}: cannot open the Optuna study: {e}") from None


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
    """Ask for new candidate layouts and tell their outcomes, over one Optuna study."""

    def __init__(self, plan: Plan, study: optuna.Study, *, sampler: str, max_trials: int, seed: int = 0) -> None:
        self.plan = plan
        self.study = study
        self.sweep = plan.sweep
        self.rows = np.flatnonzero(plan.candidate_mask)
        self.searched = [k for k in KNOBS if len(self.sweep.space[k]) > 1]
        self.exhaustive = sampler == "grid" or (sampler == "auto" and len(self.rows) <= max_trials)
        self._rng = np.random.default_rng(seed)
        self._row_of_key = {self._key_of_row(int(r)): int(r) for r in self.rows}
        self.done: dict[int, float] = {}  # plan row -> objective told
        self.running: set[int] = set()

    # ---- identity of layouts ---------------------------------------------------------
    def _key_of_row(self, row: int) -> tuple:
        cols = {k: v[row : row + 1] for k, v in self.plan.cols.items()}
        return _canonical_key(cols)

    def row_of(self, layout: Layout) -> int | None:
        """The candidate row that runs this layout (itself or its equivalent), or None if rejected."""
        return self._row_of_key.get(_canonical_key(layout.columns(self.sweep)))

    # ---- ask / tell ------------------------------------------------------------------
    def remaining(self) -> int:
        return len(self.rows) - len(self.done) - len(self.running)

    def ask(self, *, max_rejections: int = 200) -> Proposal | None:
        """The next new candidate, or None when every candidate has been tried or is running."""
        if self.remaining() <= 0:
            return None
        if self.exhaustive:
            return self._ask_enqueued(self._next_in_order())
        for _ in range(max_rejections):
            trial = self.study.ask()
            values = {k: trial.suggest_categorical(k, list(self.sweep.space[k])) for k in self.searched}
            layout = self._layout(values)
            row = self.row_of(layout)
            if row is None:
                why = layout.rejection(self.sweep)
                trial.set_user_attr("kind", "rejected")
                trial.set_user_attr("reason", why.message if why else "pruned: predicted memory over the card")
                self.study.tell(trial, FAILED_OBJECTIVE)
            elif row in self.done:
                trial.set_user_attr("kind", "repeat")
                self.study.tell(trial, self.done[row])
            elif row in self.running:
                trial.set_user_attr("kind", "repeat")
                self.study.tell(trial, state=TrialState.FAIL)
            else:
                self.running.add(row)
                return Proposal(trial.number, row, self.plan.layout(row))
        # the sampler keeps proposing what is known: take an untried candidate at random
        untried = [int(r) for r in self.rows if r not in self.done and r not in self.running]
        return self._ask_enqueued(int(self._rng.choice(untried)))

    def _next_in_order(self) -> int:
        return next(int(r) for r in self.rows if r not in self.done and r not in self.running)

    def _ask_enqueued(self, row: int) -> Proposal:
        params = {k: _python(self.plan.cols[k][row]) for k in self.searched}
        self.study.enqueue_trial(params, skip_if_exists=False)
        trial = self.study.ask()
        for k in self.searched:
            trial.suggest_categorical(k, list(self.sweep.space[k]))
        self.running.add(row)
        return Proposal(trial.number, row, self.plan.layout(row))

    def tell(self, optuna_trial: int, row: int, *, status: str, mfu: float | None) -> None:
        """Record a finished trial: MFU when it ran, the failure objective otherwise."""
        value = mfu if (status == "ok" and mfu is not None) else FAILED_OBJECTIVE
        self.running.discard(row)
        self.done[row] = value
        try:
            self.study.tell(optuna_trial, value)
        except (ValueError, RuntimeError, KeyError):
            pass  # the trial was already finished in the study (e.g. told before a crash)

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
