"""The dry run as records: how every layout of the cross product ends (each status, and each reason
within it, adding up to the cross product), the reason that removed the most, and what the sweep
would cost. Plain functions returning dataclasses: `sweeper.cli.render` draws them and
`sweep run --dry-run --json` prints them, so another figure of the plan is one more function here.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from sweeper.layouts.layout import RULE_SUMMARIES, RULES
from sweeper.plan.plan import Plan, messages
from sweeper.statuses import PlanReason, PlanStatus

# A reason whose layouts break it with more distinct values than this shows the most frequent ones
# and folds the rest into one line (the plan's `reason` column, `--out`, has every layout's own)
SHOWN_PER_REASON = 3
# What a trial costs besides its steps, assumed (the dry run says so): the job starting on its
# nodes, the processes' launch, NCCL's set-up and the model's build before the first step
TRIAL_STARTUP_S = 120.0
# the order the summary lists the statuses in: what runs first, then what does not and why
STATUS_ORDER = (PlanStatus.CANDIDATE, PlanStatus.UNCERTAIN, PlanStatus.PRUNED, PlanStatus.INVALID)
_RULES = {r.code.value: r for r in RULES}


@dataclass(frozen=True)
class ReasonCount:
    """Layouts that one reason removed, with a line naming the value and the limit."""

    code: str
    text: str
    count: int


@dataclass(frozen=True)
class StatusCount:
    """Layouts of one plan status; for invalid ones, the reasons, which add up to `count`."""

    status: str
    text: str
    count: int
    reasons: tuple[ReasonCount, ...] = ()


@dataclass(frozen=True)
class PlanCounts:
    """Every layout of the cross product under exactly one status: the counts add up to `layouts`."""

    layouts: int
    statuses: tuple[StatusCount, ...]
    near_card: int  # pruned layouts within memory.probe_margin of the card (among the pruned)

    @property
    def runnable(self) -> int:
        """Layouts the search may run: candidates and uncertain ones."""
        return sum(s.count for s in self.statuses if PlanStatus(s.status).runnable())


def plan_counts(plan: Plan) -> PlanCounts:
    """The plan's layouts per status, the invalid ones per reason."""
    counts = plan.counts()
    statuses = tuple(
        StatusCount(
            s.value,
            _status_text(plan, s),
            counts.get(s, 0),
            tuple(invalid_reasons(plan)) if s is PlanStatus.INVALID else (),
        )
        for s in STATUS_ORDER
    )
    return PlanCounts(len(plan), statuses, int(plan.near_card().sum()))


def _status_text(plan: Plan, status: PlanStatus) -> str:
    sweep = plan.sweep
    if status is PlanStatus.CANDIDATE:
        return "predicted to fit"
    if status is PlanStatus.UNCERTAIN:
        return "predicted over the card by less than the memory estimate's error: the search tries them too"
    if status is PlanStatus.PRUNED:
        share = 100 * (1 - sweep.memory.headroom)
        return f"predicted memory over {share:.0f}% of {sweep.cluster.gpu.memory_gib:g} GiB"
    return "breaking a rule of the layout or of the trainer, a duplicate, or left out by the launcher"


def invalid_reasons(plan: Plan) -> list[ReasonCount]:
    """The invalid layouts per reason, most first; a reason with several values (kernels, tp...)
    gives a line per value, up to SHOWN_PER_REASON, the rest folded in one."""
    invalid = plan.status == PlanStatus.INVALID
    out: list[ReasonCount] = []
    for code, _ in Counter(plan.reason_code[invalid].tolist()).most_common():
        rows = np.flatnonzero(invalid & (plan.reason_code == code))
        lines = Counter(_reason_texts(plan, code, rows).tolist()).most_common()
        if len(lines) > SHOWN_PER_REASON:
            rest = lines[SHOWN_PER_REASON - 1 :]
            folded = f"{RULE_SUMMARIES.get(code, code)}: {len(rest)} more cases (--out gives each layout's reason)"
            lines = [*lines[: SHOWN_PER_REASON - 1], (folded, sum(n for _, n in rest))]
        out += [ReasonCount(code, text, n) for text, n in lines]
    return out


def _reason_texts(plan: Plan, code: str, rows: np.ndarray) -> np.ndarray:
    """Each row's line for the summary: the rule's summary, then the value and the limit."""
    if code == PlanReason.DUPLICATE:
        return np.full(rows.size, RULE_SUMMARIES[code], dtype=object)
    if code == PlanReason.LAUNCHER_CANNOT_RUN:  # the launcher's own words (a replay: its table)
        return np.asarray([f"left out: {r}" for r in plan.reason[rows]], dtype=object)
    rule = _RULES.get(code)
    if rule is None:
        return plan.reason[rows].astype(object)
    detail, sweep = rule.detail, plan.sweep
    if detail is None:
        return np.asarray([f"{rule.summary}: {r}" for r in plan.reason[rows]], dtype=object)
    return messages(lambda cols, i: f"{rule.summary}: {detail(cols, sweep, i)}", plan.cols, rows)


def top_reason(plan: Plan) -> ReasonCount | None:
    """The reason that removed the most layouts (all its values together), in the line of its most
    frequent value; None when nothing was removed."""
    per_code: Counter[str] = Counter()
    example: dict[str, ReasonCount] = {}
    for r in invalid_reasons(plan):
        per_code[r.code] += r.count
        example.setdefault(r.code, r)
    pruned = plan.status == PlanStatus.PRUNED
    if pruned.any():
        per_code[PlanReason.MEMORY.value] = int(pruned.sum())
        example[PlanReason.MEMORY.value] = ReasonCount(PlanReason.MEMORY.value, _memory_line(plan, pruned), 0)
    if not per_code:
        return None
    code, n = per_code.most_common(1)[0]
    return ReasonCount(code, example[code].text, n)


def _memory_line(plan: Plan, pruned: np.ndarray) -> str:
    """The pruning as a value and a limit: the least hungry pruned layout against the usable card."""
    need = float(np.nanmin(plan.memory.total[pruned])) / 1024**3
    usable = plan.memory.capacity_bytes / 1024**3
    gpu = plan.sweep.cluster.gpu.name
    return f"predicted memory over the card: the least needs {need:.1f} GiB > {usable:.1f} GiB usable on {gpu}"


def no_candidates_message(plan: Plan) -> str:
    """Why a plan leaves the search nothing to run: the reason that removed the most."""
    top = top_reason(plan)
    why = f"; the reason that removed the most ({top.count} of {len(plan)} layouts): {top.text}" if top else ""
    return f"{plan.sweep.name}: no candidate layout is left after the plan{why}"


@dataclass(frozen=True)
class TrialStartup:
    """What a trial costs besides its steps, and where the figure comes from (the dry run says it)."""

    seconds: float = TRIAL_STARTUP_S
    source: str = "assumed"
    runs_steps: bool = True  # False: a trial costs no steps (a replay answers from its table)

    def text(self) -> str:
        return f"{self.seconds / 60:g} min" if self.seconds >= 120 else f"{self.seconds:.0f} s"


@dataclass(frozen=True)
class CostEstimate:
    """What the sweep would spend, predicted before any trial: its trials at the plan's step times."""

    budget: int  # search.max_trials
    runnable: int  # layouts the search may run
    trials: int  # what it would run: the budget, or every runnable layout when fewer
    parallel: int  # search.parallel: trials at a time
    gpus_per_trial: int
    steps: int  # trial.steps
    startup_s: float  # per trial (`TrialStartup`: measured, the launcher's default, or none for a replay)
    trial_s: float  # one trial, the mean over the runnable layouts (start-up + steps; at most the time limit)
    gpu_hours: float
    wall_hours: float
    gpus_most: int = 0  # over several node counts: the largest size's GPUs (gpus_per_trial: the smallest's)
    startup: TrialStartup = TrialStartup()

    @property
    def assumes(self) -> str:
        """What the estimate takes for granted, in a line."""
        which = "every runnable layout" if self.trials >= self.runnable else "the mean of the runnable layouts"
        start = f"each trial {self.startup.text()} of start-up ({self.startup.source})"
        if not self.startup.runs_steps:
            return f"{start} and no steps, {self.parallel} at a time"
        return (
            f"{start} + {self.steps} steps at the plan's predicted "
            f"step time ({which}), {self.parallel} at a time; no trial stopped early, no queue wait"
        )


def cost_estimate(plan: Plan, startup: TrialStartup | None = None) -> CostEstimate:
    """The sweep's trials, GPU-hours and wall time at its budget and `parallel`, from the predicted
    step times of the layouts it may run and each trial's `startup` (`launchers.trial_startup`)."""
    startup = startup or TrialStartup()
    sweep = plan.sweep
    runnable = plan.candidate_mask
    trials = min(sweep.search.max_trials, int(runnable.sum()))
    per_trial = np.minimum(
        startup.seconds + startup.runs_steps * sweep.trial.steps * plan.throughput.total[runnable],
        sweep.trial.timeout_min * 60,
    )
    trial_s = float(per_trial.mean()) if per_trial.size else 0.0
    parallel = min(sweep.search.parallel, max(trials, 1))
    # over several node counts each layout's trial takes its own size's GPUs: GPU-hours weigh each by them
    gpus_of = plan.nodes[runnable] * sweep.cluster.gpus_per_node
    gpu_s = float((per_trial * gpus_of).mean()) if per_trial.size else 0.0
    gpus = sweep.cluster.world
    return CostEstimate(
        budget=sweep.search.max_trials,
        runnable=int(runnable.sum()),
        trials=trials,
        parallel=sweep.search.parallel,
        gpus_per_trial=gpus,
        steps=sweep.trial.steps,
        startup_s=startup.seconds,
        trial_s=trial_s,
        gpu_hours=trials * gpu_s / 3600,
        wall_hours=math.ceil(trials / parallel) * trial_s / 3600,
        gpus_most=int(gpus_of.max()) if sweep.several_sizes and gpus_of.size else 0,
        startup=startup,
    )
