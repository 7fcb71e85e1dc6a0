"""The search: which layout runs next, and an Optuna study that holds exactly the trials the sweep ran.

`auto` (the default) runs, each time, the untried layout most likely to run and be the best per
trial spent (`sweeper.search.acquisition`): the throughput model (recalibrated by what ran) is the prior,
with what earlier sweeps on the cluster taught when a learned profile is used (`sweeper.search.prior`), a
Gaussian process of its residual over the knobs (`sweeper.search.residual`) is what the trials taught,
and each layout's chance to run (to fit the card, moved by what its neighbours did) weighs it. `tpe`, `gp` and
`random` let the named Optuna sampler propose, in a scratch study of its own where rejected and
repeated proposals are told and forgotten. Either way the sweep's study receives one trial per
sweep trial, enqueued with the chosen layout: COMPLETE with its MFU, FAIL when it failed, PRUNED
when it was stopped early, so optuna-dashboard shows only what ran.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from sweeper.estimate.memfit import fit_chance_given, refitted_total
from sweeper.estimate.step_time import Calibration, StepTime
from sweeper.knobs import KNOBS
from sweeper.layouts.layout import Layout
from sweeper.plan.plan import Plan
from sweeper.plan.summary import TRIAL_STARTUP_S
from sweeper.search.acquisition import best_chance
from sweeper.search.budget import trial_gpu_hours
from sweeper.search.learn import Learning
from sweeper.search.over_sizes import Belief, elsewhere_step_s, next_over_sizes
from sweeper.search.prior import EffectPrior, Prior
from sweeper.search.residual import Residual, features, ok_chance
from sweeper.search.schedule import Schedule, make_sampler
from sweeper.search.span import size_features
from sweeper.search.stopping import mfu_seconds
from sweeper.search.study import mirror_trial, tell_study, trial_attrs
from sweeper.statuses import PlanStatus, TrialStatus

FAILED_OBJECTIVE = 0.0  # what a failed, OOM or rejected layout is worth to a sampler (MFU 0)


@dataclass(frozen=True)
class Proposal:
    """A new candidate to run: the Optuna trial that proposed it and the plan row."""

    optuna_trial: int
    row: int
    layout: Layout


class LayoutSearch:
    """Ask for new candidate layouts and tell their outcomes, over one Optuna study.

    `auto` (the default) runs the untried layout of highest expected speed, weighed by its chance to
    run (module docstring). Every outcome teaches: an OOM excludes the layouts that need at
    least as much memory, measured step times recalibrate the throughput model and refit the
    residual process, measured peaks refit the memory estimate both ways, a layout that ran
    re-admits the pruned layouts that need no more memory, and a clearly faster layout just
    over the card gets a probe trial (`sweeper.estimate.memfit`).
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
        prior: Prior | None = None,
    ) -> None:
        self.plan = plan
        self.study = study
        self.sweep = plan.sweep
        self.sampler, self.max_trials = sampler, max_trials
        self.rows = np.flatnonzero(plan.candidate_mask)
        self.searched = [k for k in KNOBS if len(self.sweep.space[k]) > 1]
        # a sweep over several node counts: `nodes` is one more parameter of every Optuna trial
        sizes = {"nodes": self.sweep.node_counts} if self.sweep.several_sizes else {}
        self.space: dict[str, tuple[Any, ...]] = dict(self.sweep.space) | sizes
        self.params = [*self.searched, *sizes]
        self.left_out: dict[int, str] = {}  # node count -> why the search no longer spends trials there
        self.settled = False  # over several node counts: every size in play settled within noise
        self.over_budget = False  # no untried layout's trial fits in what the GPU-hour budget leaves
        self.startup_s = TRIAL_STARTUP_S  # a trial's start-up, for its GPU-hours (the run sets its launcher's)
        self.policy = Schedule.of(sampler, n_candidates=len(self.rows), max_trials=max_trials, seed_trials=seed_trials)
        self.stop_margin = stop_margin
        self._rng = np.random.default_rng(seed)
        self.done: dict[int, float] = {}  # plan row -> objective told
        self.outcome: dict[int, str] = {}  # plan row -> trial status
        self.running: set[int] = set()
        self.reported: dict[int, int] = {}  # Optuna trial -> steps reported as intermediate values
        self.learning = Learning(plan, prior=prior or Prior())
        if not self.policy.in_plan_order:  # grid runs the plan as planned
            self.learning.add_probes()
        # the residual process is defined over every layout the search could ever run: the
        # candidates and the pruned layouts a trial may re-admit
        self._scored = np.flatnonzero(plan.status != PlanStatus.INVALID)
        self._pos = np.full(len(plan), -1, dtype=np.int64)
        self._pos[self._scored] = np.arange(self._scored.size)
        extra = size_features(plan, self._scored) if self.sweep.several_sizes else None
        self.residual = Residual(features(plan.cols, self._scored, self.searched, extra))
        # learned knob-value effects: the residual's prior mean (None without a learned profile)
        effects = EffectPrior(plan.cols, self._scored, self.searched, prior) if prior else None
        self.effects = effects if effects is not None and effects.active else None
        self._fitted = 0  # measured layouts the residual was last fitted on
        self._scratch: optuna.Study | None = None  # the named sampler's own study (tpe, gp, random)
        self._scratch_of: dict[int, int] = {}  # plan row -> its scratch trial, while it runs
        if not self.policy.exploit(started=0):
            optuna.logging.set_verbosity(logging.WARNING)
            self._scratch = optuna.create_study(
                direction="maximize", sampler=make_sampler(sampler, seed=seed, budget=max_trials)
            )

    # What the trials taught, as the rest of the code and the tests read it.
    @property
    def exhaustive(self) -> bool:
        return self.policy.exhaustive

    @property
    def excluded(self) -> dict[int, str]:
        return self.learning.excluded

    @property
    def pred_mfu(self) -> np.ndarray:
        """MFU of every layout as the search now expects it: the recalibrated model, corrected by the residual."""
        out = self.learning.pred_mfu.copy()
        out[self._scored] = out[self._scored] * np.exp(-self._residual_mean(self._scored))
        return out

    @property
    def calibration(self) -> Calibration:
        return self.learning.calibration

    @property
    def model(self) -> StepTime:
        return self.learning.model

    def row_of(self, layout: Layout, nodes: int | None = None) -> int | None:
        """The plan row that runs this layout (on `nodes`): a candidate, or a pruned layout the trials re-admitted."""
        row = self.plan.row_of(layout, nodes=nodes)
        if row is None:
            valid = self.plan.row_of(layout, pruned=True, nodes=nodes)
            row = valid if valid in self.learning.readmitted else None
        return row

    # ---- ask / tell ------------------------------------------------------------------
    def untried(self) -> list[int]:
        pool = [*self.rows.tolist(), *(r for r in self.learning.readmitted if not self.plan.candidate_mask[r])]
        return [int(r) for r in pool if r not in self.done and r not in self.running and r not in self.excluded]

    def remaining(self) -> int:
        return len(self.untried())

    def ask(self, *, max_rejections: int = 200, trial_number: int | None = None) -> Proposal | None:
        """The next new candidate with its trial in the study, or None when every candidate has been
        tried, runs or is excluded. `trial_number`: the sweep's number for it (`enqueue`)."""
        row = self.choose(max_rejections=max_rejections)
        if row is None:
            return None
        return Proposal(self.enqueue(row, trial_number=trial_number), row, self.plan.layout(row))

    def _at_sizes(self, rows: np.ndarray) -> np.ndarray:
        """Over several node counts, what the rule leaves of `rows` (`over_sizes.next_over_sizes`):
        one row, the open sizes' rows (seed trials left), or none (`settled`); `left_out`: the sizes
        that cannot win, and why. The last of `max_trials` may be kept for confirmations (`sizes.reserved`)."""
        if not self.sweep.several_sizes:
            return rows
        untried = np.asarray(self.untried(), dtype=np.int64)
        expected_s, sigma = self.expected_step_s(untried), np.zeros(untried.size)
        if untried.size:
            sigma = self.residual.predict(self._pos[untried])[1]
        ok = {int(r): t for r, t in self.learning.measured.items() if self.outcome.get(int(r)) == TrialStatus.OK}
        hours = self.trial_gpu_hours(untried, expected_s)
        started = len(self.done) + len(self.running)
        elsewhere, ok_chance, left = self.elsewhere_step_s(untried), self._ok_chance(untried), self.max_trials - started
        belief = Belief(untried, expected_s, sigma, elsewhere, ok_chance, hours, ok, (*self.running,), left)
        choice = next_over_sizes(self.plan, rows, belief, by_prior=self.policy.by_prior(started=started))
        self.left_out, self.settled = choice.left_out, choice.settled
        return choice.rows

    def trial_gpu_hours(self, rows: np.ndarray, step_s: np.ndarray | None = None) -> np.ndarray:
        """GPU-hours each layout's trial is expected to take (`sweeper.search.budget.trial_gpu_hours`):
        its GPUs x (start-up + steps at `step_s`, by default the step time the search expects)."""
        step_s = self.expected_step_s(rows) if step_s is None else step_s
        gpus = self.plan.nodes[rows] * self.sweep.cluster.gpus_per_node
        return trial_gpu_hours(gpus, step_s, self.sweep.trial, self.startup_s)

    def choose(self, *, max_rejections: int = 200, gpu_hours_left: float | None = None) -> int | None:
        """The plan row to run next, marked running (its study trial is made by `enqueue`), or None.
        `gpu_hours_left`: what the sweep's GPU-hour budget leaves; only a layout whose trial is
        expected to take no more (`trial_gpu_hours`) is started (none: `over_budget`)."""
        untried = self.untried()
        if gpu_hours_left is not None and untried:
            fits = self.trial_gpu_hours(np.asarray(untried, dtype=np.int64)) <= gpu_hours_left
            self.over_budget = not fits.any()
            untried = [r for r, ok in zip(untried, fits) if ok]
        if not untried:
            return None
        if self.policy.in_plan_order:
            row = untried[0]
        elif self.policy.exploit(started=(started := len(self.done) + len(self.running))):
            rows = self._at_sizes(np.asarray(untried, dtype=np.int64))
            if not rows.size:  # every size in play settled within noise: nothing left worth a trial
                return None
            if self.policy.by_prior(started=started):
                prior = self.learning.pred_mfu[rows] * np.exp(-self._learned_mean(rows))
                row = int(rows[np.argmax(prior * self.fit_chance(rows))])
            else:
                row = int(rows[np.argmax(self.scores(rows))])
        else:
            row = self._ask_sampler(max_rejections, set(untried))
        self.running.add(row)
        return row

    def expected_step_s(self, rows: np.ndarray) -> np.ndarray:
        """Step time each layout is expected to take: the recalibrated model corrected by the residual."""
        return self.model_step_s(rows) * np.exp(self._residual_mean(rows))

    def fit_chance(self, rows: np.ndarray) -> np.ndarray:
        """The chance each layout fits the card: 1 once proven, the plan's (estimate's error band) otherwise.

        Once the estimate is refitted (by measured peaks, or from a learned profile), the layouts in
        doubt (uncertain, re-admitted) are judged on the refitted estimate: a pruned layout a refit
        re-admitted is as likely to fit as the refit says, not as the plan's estimate said."""
        chance = self.plan.fit_chance[rows].copy()
        mem, fit = self.plan.memory, self.learning.memory_fit
        refitted = fit.points > 0 or self.learning.prior.memory is not None
        doubt = np.isin(rows, list(self.learning.readmitted)) | (self.plan.status[rows] == PlanStatus.UNCERTAIN)
        if (
            doubt.any()
        ):  # the estimate's band (refitted, if anything refitted it), narrowed by what ran and what ran out
            total = refitted_total(mem, fit) if refitted else mem.total
            seen, ran, oom = self._told()
            chance[doubt] = fit_chance_given(total[rows[doubt]], mem.capacity_bytes, total[seen[ran]], total[seen[oom]])
        chance[np.isin(rows, list(self.learning.proven))] = 1.0
        return chance

    def _told(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The finished plan rows, and which of them ran (or were stopped running) and which ran out of memory."""
        seen = np.asarray(list(self.outcome), dtype=np.int64)
        status = [TrialStatus(s) for s in self.outcome.values()]
        ran = np.asarray([s.succeeded() or s.was_stopped() for s in status], dtype=bool)
        return seen, ran, np.asarray([s.is_oom() for s in status], dtype=bool)

    def scores(self, rows: np.ndarray) -> np.ndarray:
        """Log of the chance each layout runs and is the best (`sweeper.search.acquisition`), from its expected
        speed (1 / step time: the recalibrated model corrected by the residual's mean) and its chance to run.

        The posterior's mean, not an expected improvement: with the model as prior the first trials
        follow its order, and the search leaves it only where measurements contradict it (a slow
        layout slows its neighbours' prediction, a fast one speeds it). An expected improvement
        rewards the residual's uncertainty away from what ran, and spent the few trials that count
        on layouts the model ranks far down (benchmarks/search_public.py: 10 of 15 tuned ultrascale
        cells within 5 trials with it, 13 without; the quirk replay 15-18 trials, 4 without)."""
        log_speed = -(np.log(self.model_step_s(rows)) + self._residual_mean(rows))
        measured = self.learning.measured
        return best_chance(log_speed, self._ok_chance(rows), -np.log(np.fromiter(measured.values(), float)))

    def _residual_mean(self, rows: np.ndarray) -> np.ndarray:
        """log(true / calibrated step time) as the search expects it: the learned effects, if any, and
        the residual process fitted to what this sweep measured beyond them."""
        self._refit()
        mean, _ = self.residual.predict(self._pos[rows])
        return mean + self._learned_mean(rows)

    def _learned_mean(self, rows: np.ndarray) -> np.ndarray:
        return self.effects.mean(self._pos[rows]) if self.effects is not None else np.zeros(len(rows))

    def _ok_chance(self, rows: np.ndarray) -> np.ndarray:
        """The chance to fit, moved by what the finished layouts like these did (ran, or failed).

        An OOM says something of memory only: it moves the layouts whose fit is in doubt (uncertain,
        re-admitted), and the plan's candidates only when it was a candidate's (the estimate was too
        low there); a layout proven to fit (`Learning.proven`) is moved only by crashes and runs. A
        layout in doubt is never moved above its chance to fit by neighbours that ran: they may need
        less memory (one that needs more and ran proves it fits)."""
        seen, ran_mask, oom = self._told()
        ran = ran_mask.astype(float)
        oom_of_candidate = oom & (self.plan.status[seen] == PlanStatus.CANDIDATE)
        prior = self.fit_chance(rows)
        proven = np.isin(rows, list(self.learning.proven))
        candidate = ~proven & (self.plan.status[rows] == PlanStatus.CANDIDATE)
        out = prior.copy()
        for mask, told in (
            (proven, ~oom),
            (candidate, ~oom | oom_of_candidate),
            (~proven & ~candidate, np.ones_like(oom)),
        ):
            if mask.any():
                out[mask] = ok_chance(
                    self.residual.x, self._pos[rows[mask]], prior[mask], self._pos[seen[told]], ran[told]
                )
        doubt = ~proven & ~candidate
        out[doubt] = np.minimum(out[doubt], prior[doubt])
        return out

    def model_step_s(self, rows: np.ndarray) -> np.ndarray:
        """Step time of each layout as the recalibrated model predicts it (without the residual)."""
        m, c = self.model, self.calibration
        return np.maximum(c.compute_scale * m.compute[rows] + c.comm_scale * m.comm[rows], 1e-12)

    def elsewhere_step_s(self, rows: np.ndarray) -> np.ndarray:
        """Step time of each layout as the model predicts it scaled by what the trials at the OTHER sizes
        measured (`sweeper.search.over_sizes.elsewhere_step_s`)."""
        return elsewhere_step_s(self.plan, self.model, self.learning.measured, self.learning.prior, rows)

    def _refit(self) -> None:
        """Fit the residual to every measured step time (when something new was measured)."""
        measured = self.learning.measured
        if len(measured) == self._fitted:
            return
        rows = np.asarray(list(measured), dtype=np.int64)
        times = np.asarray([measured[int(r)] for r in rows])
        log_ratio = np.log(times / self.model_step_s(rows))
        if self.effects is not None:  # the learned effects, corrected by what this sweep measured
            self.effects.measured(self._pos[rows])
            log_ratio = log_ratio - self.effects.mean(self._pos[rows])
        self.residual.fit(self._pos[rows], log_ratio)
        self._fitted = len(measured)

    def _ask_sampler(self, max_rejections: int, allowed: set[int]) -> int:
        """A proposal of the named sampler, from its scratch study: rejected or repeated layouts are told
        there (MFU 0, or their known result) and never reach the sweep's study; an untried layout
        outside `allowed` (over the GPU-hour budget) is told as failed there, not as measured."""
        assert self._scratch is not None
        for _ in range(max_rejections):
            trial = self._scratch.ask()
            values = {k: trial.suggest_categorical(k, list(self.space[k])) for k in self.params}
            nodes = values.pop("nodes", None)
            row = self.row_of(self._layout(values), nodes)
            if row is None or row in self.excluded:
                self._scratch.tell(trial, FAILED_OBJECTIVE)
            elif row in self.done:
                self._scratch.tell(trial, self.done[row])
            elif row in self.running or row not in allowed:
                self._scratch.tell(trial, state=TrialState.FAIL)
            else:
                self._scratch_of[row] = trial.number
                return row
        # the sampler keeps proposing what is known: take an allowed untried candidate at random
        return int(self._rng.choice(sorted(allowed)))

    def enqueue(self, row: int, *, trial_number: int | None = None, known: int | None = None) -> int:
        """The sweep's study gets one RUNNING trial with the layout's parameters and attributes, made in
        one write (a trial asked and then suggested would take one per knob); returns its number.

        With the sweep's `trial_number` the trial carries it and is numbered by it (`mirror_trial`:
        `known`, a number recorded for it, or the one made before a kill, is taken, not made twice)."""
        self.running.add(row)
        attrs = {} if trial_number is None else {"trial_number": trial_number}
        template = self.trial_of(self.plan.layout(row), attrs=attrs, nodes=self.plan.nodes_of(row))
        if trial_number is not None:
            return mirror_trial(self.study, template, number=trial_number, known=known)
        trial_id = self.study._storage.create_new_trial(self.study._study_id, template_trial=template)
        return self.study._storage.get_trial_number_from_id(trial_id)

    def trial_of(
        self,
        layout: Layout,
        *,
        attrs: dict[str, Any],
        state: TrialState = TrialState.RUNNING,
        value: float | None = None,
        nodes: int | None = None,
    ) -> optuna.trial.FrozenTrial:
        """A study trial of `layout`: its searched knobs (and `nodes`) as parameters, when in the space."""
        knobs = layout.as_dict() | ({"nodes": nodes} if "nodes" in self.params else {})
        params = {k: _python(knobs[k]) for k in self.params}
        if any(v not in self.space[k] for k, v in params.items()):
            params = {}  # a row outside the space: its trial keeps the number, not the parameters
        dists: dict[str, BaseDistribution] = {k: CategoricalDistribution(list(self.space[k])) for k in params}
        return optuna.trial.create_trial(
            state=state, value=value, params=params, distributions=dists, user_attrs=trial_attrs(layout) | attrs
        )

    def report_steps(self, optuna_trial: int, step_mfu: list[float]) -> int | None:
        """Report the MFU of each measured step not yet reported; the number of steps after which the
        pruner stops the trial, or None while it may go on."""
        trial_id = self.study._storage.get_trial_id_from_study_id_trial_number(self.study._study_id, optuna_trial)
        trial = optuna.trial.Trial(self.study, trial_id)
        done = self.reported.get(optuna_trial, 0)
        for i in range(done, len(step_mfu)):
            trial.report(step_mfu[i], i)
            self.reported[optuna_trial] = i + 1
            if trial.should_prune():
                return i + 1
        return None

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
        measured = status.succeeded() or status.was_stopped()
        value = mfu if (measured and mfu is not None) else FAILED_OBJECTIVE
        self.running.discard(row)
        self.excluded.pop(row, None)
        self.settled = self.over_budget = False  # judged again at the next choice, with this trial told
        self.done[row] = value
        self.outcome[row] = status
        if self._scratch is not None:
            self._tell_scratch(row, value if measured else FAILED_OBJECTIVE)
        if status.is_oom():
            self.learning.learn_oom(row, self.untried())
        if measured and not step_time_s and mfu:  # a table of MFU only: its step time is the same fact
            step_time_s = mfu_seconds(self.plan.sweep_of(row)) / mfu
        if measured and step_time_s:
            if self.effects is not None:  # trusted as far as this sweep's own step times bear it out
                told = self.learning.measured | {row: step_time_s}
                self.learning.prior_trust = self.effects.weigh_measured(self.model, told, self._pos)
            self.learning.learn_step_time(row, step_time_s)
        device_peak = bool(device) and not str(device).startswith("cpu")  # CPU RSS growth is no allocator peak
        if measured and device_peak and (peak_mem_gib or peak_mem_reserved_gib):
            self.learning.learn_peak(
                row, peak_mem_gib, peak_mem_reserved_gib, self.untried(), busy=self.done.keys() | self.running
            )
        if measured:
            self.learning.learn_ran(row, done=self.done.keys())
        return value

    def _tell_scratch(self, row: int, value: float) -> None:
        assert self._scratch is not None
        number = self._scratch_of.pop(row, None)
        if number is not None:
            self._scratch.tell(number, value, skip_if_finished=True)
            return
        self._scratch.add_trial(
            self.trial_of(
                self.plan.layout(row), attrs={}, state=TrialState.COMPLETE, value=value, nodes=self.plan.nodes_of(row)
            )
        )

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
        if self.settled or self.over_budget:  # nothing worth a trial, or nothing the budget affords
            return True
        ok = [v for r, v in self.done.items() if v > 0 and self.outcome.get(r) == TrialStatus.OK]
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
