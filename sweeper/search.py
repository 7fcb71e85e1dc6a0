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
from sweeper.hardware import GIB
from sweeper.knobs import KNOBS
from sweeper.layout import NO_EFFECT_VALUE, Layout, ineffective
from sweeper.learn import needs_at_least
from sweeper.memfit import MemoryFit, mirror, probe_rows, refit, refitted_total
from sweeper.perfmodel import Calibration, calibrate, predict
from sweeper.plan import PRUNED, Plan

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
    """Ask for new candidate layouts and tell their outcomes, over one Optuna study.

    `auto` (the default) runs every candidate, best predicted first, when they fit in the
    budget; otherwise it spends its first trials on the layouts the throughput model ranks
    highest, then alternates: TPE explores, the recalibrated model exploits. Every outcome teaches: an OOM excludes the layouts that
    need at least as much memory, measured step times recalibrate the throughput model,
    measured peaks refit the memory estimate both ways, a layout that ran re-admits the pruned
    layouts that need no more memory, and a clearly faster layout just over the card gets a
    probe trial (`sweeper.memfit`).
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
        self.running: set[int] = set()
        self.excluded: dict[int, str] = {}  # candidate rows ruled out by what trials taught
        self.model = predict(plan.cols, self.sweep)
        self.calibration = Calibration()
        self.pred_mfu = self.model.mfu
        self._measured: dict[int, float] = {}  # plan row -> measured step time
        self._peaks: dict[int, float] = {}  # plan row -> measured peak GiB (GPU runs only)
        self._reserved: dict[int, float] = {}  # plan row -> measured reserved GiB, where logged
        # memory learned both ways (sweeper.memfit): pruned rows re-admitted, and why
        self.readmitted: dict[int, str] = {}
        self._mem_excluded: set[int] = set()  # excluded by a refit (a later refit may re-admit)
        self._proven: set[int] = set()  # fit for certain: they ran, or need no more than one that ran
        self.memory_fit = MemoryFit()
        mem = plan.memory
        probes = [] if sampler == "grid" else probe_rows(
            mem.total, mem.capacity_bytes, self.sweep.memory.probe_margin, plan.status == PRUNED,
            plan.candidate_mask, plan.pred_mfu)
        for r in probes:
            need = mem.total[r] / GIB
            self._readmit(r, f"probe: predicted {need:.1f} GiB, within {100 * self.sweep.memory.probe_margin:.0f}% "
                             f"of the card, and clearly the fastest predicted layout")

    # ---- identity of layouts ---------------------------------------------------------
    def _key_of_row(self, row: int) -> tuple:
        cols = {k: v[row : row + 1] for k, v in self.plan.cols.items()}
        return _canonical_key(cols)

    def row_of(self, layout: Layout) -> int | None:
        """The candidate row that runs this layout (itself or its equivalent), or None if rejected."""
        return self._row_of_key.get(_canonical_key(layout.columns(self.sweep)))

    # ---- ask / tell ------------------------------------------------------------------
    def untried(self) -> list[int]:
        pool = [*self.rows.tolist(), *(r for r in self.readmitted if not self.plan.candidate_mask[r])]
        return [int(r) for r in pool if r not in self.done and r not in self.running and r not in self.excluded]

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
                trial.set_user_attr("kind", "rejected")
                trial.set_user_attr("reason", reason or (why.message if why else "pruned: predicted memory over the card"))
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
                peak_mem_gib: float | None = None, device: str | None = None,
                peak_mem_reserved_gib: float | None = None) -> float:
        """Learn from a finished trial (also from an earlier run's rows); returns its objective."""
        value = mfu if (status == "ok" and mfu is not None) else FAILED_OBJECTIVE
        self.running.discard(row)
        self.excluded.pop(row, None)
        self.done[row] = value
        if status == "oom":
            self._exclude_hungrier(row)
        if status == "ok" and step_time_s:
            self._measured[row] = step_time_s
            self._recalibrate()
        gpu_peak = bool(device) and not str(device).startswith("cpu")
        if status == "ok" and gpu_peak and (peak_mem_gib or peak_mem_reserved_gib):
            self._peaks[row] = peak_mem_gib or 0.0
            if peak_mem_reserved_gib:
                self._reserved[row] = peak_mem_reserved_gib
            self._refit_memory()
        if status == "ok":
            self._mirror(row)
        return value

    def tell(self, optuna_trial: int, row: int, *, status: str, mfu: float | None, **measured: object) -> None:
        """Record a finished trial: MFU when it ran, the failure objective otherwise."""
        value = self.observe(row, status=status, mfu=mfu, **measured)  # type: ignore[arg-type]
        try:
            self.study.tell(optuna_trial, value)
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

    def _readmit(self, row: int, why: str) -> None:
        self.readmitted[row] = why
        self._row_of_key.setdefault(self._key_of_row(row), row)
        if row in self._mem_excluded:
            self._mem_excluded.discard(row)
            self.excluded.pop(row, None)

    def _refit_memory(self) -> None:
        """Refit the estimate to every measured peak; judge the untried layouts again, both ways."""
        mem = self.plan.memory
        rows = list(self._peaks)
        self.memory_fit = refit(mem, rows, [self._peaks[r] for r in rows], [self._reserved.get(r) for r in rows])
        total = refitted_total(mem, self.memory_fit)
        fits = total <= mem.capacity_bytes
        why = self.memory_fit.describe()
        # excluding is a prediction, not a fact (an OOM is): only from two peaks on, and only
        # layouts the refit puts clearly over the card (beyond memory.probe_margin)
        if self.memory_fit.points < 2:
            over = np.zeros(len(total), dtype=bool)
        else:
            over = total > mem.capacity_bytes * (1 + self.sweep.memory.probe_margin)
        for r in self.untried():
            if over[r] and r not in self._proven:
                self.excluded[r] = f"refit ({why}): needs {total[r] / GIB:.1f} GiB, over the card"
                self._mem_excluded.add(r)
        for found in np.flatnonzero(fits & (self.plan.candidate_mask | (self.plan.status == PRUNED))):
            r = int(found)
            if r in self.done or r in self.running:
                continue
            if r in self._mem_excluded or (not self.plan.candidate_mask[r] and r not in self.readmitted):
                self._readmit(r, f"refit ({why}): needs {total[r] / GIB:.1f} GiB, fits the card")

    def _mirror(self, ok_row: int) -> None:
        """A layout that ran re-admits every pruned layout that needs no more memory than it."""
        mem = self.plan.memory
        self._proven.add(ok_row)
        pool = [int(r) for r in np.flatnonzero(self.plan.status == PRUNED)
                if r not in self.done and (r not in self.readmitted or r in self._mem_excluded)]
        pool += [r for r in self._mem_excluded if self.plan.candidate_mask[r]]
        m = mirror(self.plan.cols, mem.total, mem.capacity_bytes, ok_row, np.asarray(pool, dtype=int))
        for found in m.readmit:
            r = int(found)
            self._proven.add(r)
            self._readmit(r, f"needs no more memory than plan row {ok_row}, which ran; the estimate was at least "
                             f"{m.too_high_bytes / GIB:.1f} GiB ({100 * m.too_high_share:.0f}%) too high there")

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
