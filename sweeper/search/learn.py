"""What finished trials teach about the untried layouts: memory both ways, and the throughput calibration.

Pure numpy over the plan's columns. The memory lessons' arithmetic (the partial order of
layouts by memory need, the refit, the mirror rule, probes) lives in `sweeper.estimate.memfit`; this
module keeps the state of one sweep and applies them.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from sweeper.estimate.memfit import MemoryFit, mirror, needs_at_least, needs_at_most, probe_rows, refit, refitted_total
from sweeper.estimate.step_time import Calibration, StepTime
from sweeper.plan.plan import Plan
from sweeper.search.prior import Prior
from sweeper.search.residual import calibrate
from sweeper.spec.hardware import GIB
from sweeper.statuses import PlanStatus

__all__ = ["Learning", "needs_at_least"]


@dataclass
class Learning:
    """What the finished trials of a sweep taught about the untried layouts of its plan.

    Each lesson in one method: an OOM excludes every layout that needs at least as much memory
    (`learn_oom`); measured step times refit the throughput model (`learn_step_time`); measured
    device peaks refit the memory estimate both ways (`learn_peak`); a layout that ran re-admits
    the pruned layouts that need no more (`learn_ran`); a clearly fastest layout just over the
    card gets a probe (`add_probes`).
    """

    plan: Plan
    excluded: dict[int, str] = field(default_factory=dict)  # candidate rows ruled out, and why
    measured: dict[int, float] = field(default_factory=dict)  # plan row -> measured step time (s)
    peaks: dict[int, float] = field(default_factory=dict)  # plan row -> measured peak GiB (devices with memory)
    reserved: dict[int, float] = field(default_factory=dict)  # plan row -> measured reserved GiB, where logged
    readmitted: dict[int, str] = field(default_factory=dict)  # pruned rows made runnable by what trials taught, and why
    mem_excluded: set[int] = field(default_factory=set)  # excluded by a refit (a later refit may re-admit)
    proven: set[int] = field(default_factory=set)  # fit for certain: they ran, or need no more than one that ran
    memory_fit: MemoryFit = field(default_factory=MemoryFit)
    calibration: Calibration = field(default_factory=Calibration)
    prior: Prior = field(default_factory=Prior)  # what earlier sweeps taught (a learned profile), or nothing
    prior_trust: float = 1.0  # how far this sweep's trials bear the learned profile out (search.EffectPrior.weigh)

    def __post_init__(self) -> None:
        self.pred_mfu: np.ndarray = self.model.mfu
        if self.prior.calibration is not None:  # nothing measured yet: the learned scales
            self._recalibrate(calibrate(self.model, [], [], prior=self.prior.calibration))
        if self.prior.memory is not None:
            self.memory_fit = self.prior.memory

    @property
    def model(self) -> StepTime:
        """The plan's (uncalibrated) throughput model, which the calibration rescales."""
        return self.plan.throughput

    def learn_oom(self, oom_row: int, untried: Sequence[int]) -> None:
        rows = np.asarray(untried, dtype=int)
        if rows.size == 0:
            return
        for r in rows[needs_at_least(self.plan.cols, rows, oom_row)]:
            self.excluded[int(r)] = f"needs at least the memory of a layout that ran out of memory (plan row {oom_row})"

    def learn_step_time(self, row: int, step_time_s: float) -> None:
        """Refit the model's two scales to every measured step time (robust to a quirk: `residual.calibrate`)."""
        self.measured[row] = step_time_s
        rows = list(self.measured)
        times = [self.measured[r] for r in rows]
        p = self.prior
        weight = p.calibration_weight * self.prior_trust
        self._recalibrate(calibrate(self.model, rows, times, prior=p.calibration, prior_weight=weight))

    def _recalibrate(self, calibration: Calibration) -> None:
        self.calibration = calibration
        model = self.model
        scale = model.total / np.maximum(
            calibration.compute_scale * model.compute + calibration.comm_scale * model.comm, 1e-12
        )
        self.pred_mfu = model.mfu * scale

    def learn_peak(
        self,
        row: int,
        peak_gib: float | None,
        reserved_gib: float | None,
        untried: Sequence[int],
        busy: Collection[int],
    ) -> None:
        """The memory-learning hook: refit the estimate to every measured peak; judge the untried layouts
        again, both ways (pruned ones that now fit are re-admitted, untried ones that do not are excluded)."""
        self.peaks[row] = peak_gib or 0.0
        if reserved_gib:
            self.reserved[row] = reserved_gib
        mem = self.plan.memory
        rows = list(self.peaks)
        self.memory_fit = refit(
            mem, rows, [self.peaks[r] for r in rows], [self.reserved.get(r) for r in rows], prior=self.prior.memory
        )
        total = refitted_total(mem, self.memory_fit)
        why = self.memory_fit.describe()
        # excluding is a prediction, not a fact (an OOM is): only from two peaks on, and only
        # layouts the refit puts clearly over the card (beyond memory.probe_margin)
        if self.memory_fit.points >= 2:
            over = total > mem.capacity_bytes * (1 + self.plan.sweep.memory.probe_margin)
            for r in untried:
                if over[r] and r not in self.proven:
                    self.excluded[r] = f"refit ({why}): needs {total[r] / GIB:.1f} GiB, over the card"
                    self.mem_excluded.add(r)
        valid = self.plan.candidate_mask | (self.plan.status == PlanStatus.PRUNED)
        for found in np.flatnonzero((total <= mem.capacity_bytes) & valid):
            r = int(found)
            if r in busy:
                continue
            if r in self.mem_excluded or (not self.plan.candidate_mask[r] and r not in self.readmitted):
                self.readmit(r, f"refit ({why}): needs {total[r] / GIB:.1f} GiB, fits the card")

    def learn_ran(self, ok_row: int, done: Collection[int]) -> None:
        """The mirror rule: a layout that ran re-admits every pruned layout that needs no more memory than it."""
        mem = self.plan.memory
        self.proven.add(ok_row)
        pruned = self.plan.status == PlanStatus.PRUNED
        pool = [
            int(r)
            for r in np.flatnonzero(pruned)
            if r not in done and (r not in self.readmitted or r in self.mem_excluded)
        ]
        pool += [r for r in self.mem_excluded if self.plan.candidate_mask[r]]
        # uncertain layouts needing no more than one that ran are certain now (their chance to fit is 1)
        uncertain = np.flatnonzero(self.plan.status == PlanStatus.UNCERTAIN)
        self.proven.update(int(r) for r in uncertain[needs_at_most(self.plan.cols, uncertain, ok_row)])
        m = mirror(self.plan.cols, mem.total, mem.capacity_bytes, ok_row, np.asarray(pool, dtype=int))
        for found in m.readmit:
            r = int(found)
            self.proven.add(r)
            self.readmit(
                r,
                f"needs no more memory than plan row {ok_row}, which ran; the estimate was at least "
                f"{m.too_high_bytes / GIB:.1f} GiB ({100 * m.too_high_share:.0f}%) too high there",
            )

    def add_probes(self) -> None:
        """A pruned layout just over the card whose predicted MFU clearly beats every candidate gets one trial."""
        mem, margin = self.plan.memory, self.plan.sweep.memory.probe_margin
        pruned = self.plan.status == PlanStatus.PRUNED
        for r in probe_rows(
            mem.total, mem.capacity_bytes, margin, pruned, self.plan.candidate_mask, self.plan.pred_mfu
        ):
            self.readmit(
                int(r),
                f"probe: predicted {mem.total[r] / GIB:.1f} GiB, within {100 * margin:.0f}% "
                "of the card, and clearly the fastest predicted layout",
            )

    def readmit(self, row: int, why: str) -> None:
        self.readmitted[row] = why
        if row in self.mem_excluded:
            self.mem_excluded.discard(row)
            self.excluded.pop(row, None)
