"""What a report shows, as plain records: no matplotlib, no HTML.

As Optuna's `visualization` computes each plot's `_get_*_info` apart from its renderers, the
functions here return frames, arrays and dataclasses; `plots` draws them and `page` writes them.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.knobs import KNOBS, label, layout_line, shown_in_tables
from sweeper.layouts.layout import RULE_SUMMARIES, Layout
from sweeper.plan.plan import CANDIDATE, Plan
from sweeper.spec.hardware import GIB
from sweeper.spec.sweep import Sweep
from sweeper.statuses import PlanReason, PlanStatus, TrialStatus

if TYPE_CHECKING:
    import pandas as pd

    from sweeper.results.answer import Answer


@dataclass(frozen=True)
class Plot:
    """One PNG of the report: its file name, a heading, and a caption (why it is there or why empty)."""

    file: str
    title: str
    caption: str = ""


def successful(df: pd.DataFrame) -> pd.DataFrame:
    """The trials that ran and measured an MFU."""
    return df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()]


def layout_text(row: Any) -> str:
    """A layout in one line: tp, pp, dp, mbs, grad_accum, then every other knob (`knob=value`)."""
    return layout_line(row, fmt_value)


def fmt_value(v: Any) -> str:
    return str(bool(v)).lower() if isinstance(v, (bool, np.bool_)) else str(v)


def _row_layout(r: pd.Series) -> Layout:
    """A result row's layout: a knob the row lacks (results written before it existed) at its
    default, and knobs that follow another resolved (etp)."""
    values = {k: r[k] for k in KNOBS if k in r and not (r[k] is None or (isinstance(r[k], float) and math.isnan(r[k])))}
    return Layout.from_mapping(values)


def match_plan_rows(plan: Plan, df: pd.DataFrame) -> np.ndarray | None:
    """For each result row, the index of the plan row with the same knob values; None if any is missing."""
    # a sweep over several node counts holds each layout once per size: the row's own node count keys it
    several = plan.sweep.several_sizes

    def nodes_of(value: Any) -> tuple[Any, ...]:
        return (fmt_value(value),) if several else ()

    index = {
        nodes_of(plan.cols["nodes"][i]) + tuple(fmt_value(plan.cols[k][i]) for k in KNOBS): i for i in range(len(plan))
    }
    found = [
        index.get(nodes_of(r.get("nodes")) + tuple(fmt_value(v) for v in _row_layout(r).as_dict().values()))
        for _, r in df.iterrows()
    ]
    if not found or any(i is None for i in found):
        return None
    return np.asarray(found, dtype=np.int64)


def gpu_hours(df: pd.DataFrame) -> np.ndarray:
    """Cumulative GPU-hours in trial order: num_devices x (finished_at - started_at); unknown spans count 0."""
    span_s = (df["finished_at"] - df["started_at"]).dt.total_seconds().fillna(0.0).clip(lower=0.0)
    return np.cumsum(df["num_devices"].fillna(0).to_numpy(float) * span_s.to_numpy(float) / 3600.0)


# how the page names the search that ran (search.sampler): `auto` is no grid (docs/search.md)
RUN_NAMES = {
    "auto": "Search (auto: the untried layout of highest expected gain each trial)",
    "grid": "Grid run",
    "random": "Random search",
    "tpe": "TPE search",
    "gp": "Gaussian-process search",
}


def summary_lines(sweep: Sweep, plan: Plan, df: pd.DataFrame, answer: Answer | None = None) -> list[str]:
    """The page's opening text: winner and layout, margin over the runner-up, coverage, pruned and why.
    The winner is the sweep's `answer` (`sweeper.results.answer`; by MFU without one), and over
    several node counts the runner-up is of its node count."""
    ok = successful(df).sort_values(["mfu", "trial_number"], ascending=[False, True])
    ranked = [ok.iloc[i] for i in range(len(ok))]
    head = "Winner"
    if answer is not None and answer.found is not None:
        place = {int(r["trial_number"]): i for i, r in enumerate(answer.ranked)}
        ranked = sorted(
            (r for r in ranked if int(r["trial_number"]) in place), key=lambda r: place[int(r["trial_number"])]
        )
        size = f" at {answer.nodes} node(s)" if answer.several and answer.nodes is not None else ""
        head = f"Winner --by {answer.by.value}{size}"
    lines = []
    if ranked:
        w = ranked[0]
        lines.append(f"{head}: trial {w['trial_number']} at {100 * w['mfu']:.2f}% MFU — {layout_text(w)}")
        if len(ranked) > 1:
            lines.append(margin_line(w, ranked[1]))
        else:
            lines.append(
                "No runner-up: only one trial succeeded"
                + (" at that node count." if answer and answer.several else ".")
            )
    elif len(ok):
        lines.append(answer.line() if answer is not None else "No successful trial yet.")
    else:
        lines.append("No successful trial yet.")
    counts = plan.counts()
    cands = counts.get(CANDIDATE, 0)
    share = f" ({100 * len(df) / cands:.0f}%)" if cands else ""
    statuses = ", ".join(f"{k} {v}" for k, v in Counter(df["status"]).most_common())
    lines.append(
        f"{RUN_NAMES[sweep.search.sampler]}: {len(df)} trials of {cands} candidate layouts{share}; "
        f"{len(plan)} layouts in the cross product. Trials: {statuses or 'none'}."
    )
    stopped = df[df["status"] == TrialStatus.STOPPED_EARLY]
    if len(stopped):
        saved = stopped["gpu_hours_saved"].fillna(0).sum() if "gpu_hours_saved" in stopped else 0.0
        lines.append(
            f"Stopped early (clearly slower than the best so far): {len(stopped)} trials, {saved:.3g} GPU-hours saved."
        )
    reasons = plan.reason_counts()
    pruned = counts.get(PlanStatus.PRUNED, 0)
    lines.append(
        f"Pruned by the memory estimate: {pruned}"
        + (
            f" (over {100 * (1 - sweep.memory.headroom):.0f}% of {sweep.cluster.gpu.memory_gib:g} GiB)."
            if pruned
            else "."
        )
    )
    invalid = [f"{RULE_SUMMARIES.get(code, code)}: {n}" for code, n in reasons.items() if code != PlanReason.MEMORY]
    lines.append("Invalid: " + ("; ".join(invalid) if invalid else "none") + ".")
    return lines


def margin_line(w: Any, r: Any) -> str:
    """The winner's lead over the runner-up as far as the measurements support it: with its interval
    (a win beyond noise), as a tie within noise with what would settle it, or with the noise unknown."""
    from sweeper.results.noise import INTERVAL_NAME, Verdict, margin, mfu_text

    m = margin(w, r)
    points = f"{100 * (w['mfu'] - r['mfu']):.2f} points, {100 * m.lead:.1f}% faster"
    runner = f"runner-up: {layout_text(r)}"
    if m.verdict is Verdict.UNKNOWN:
        return (
            f"Margin over the runner-up (trial {r['trial_number']}, {100 * r['mfu']:.2f}% MFU): {points}; "
            f"whether that is beyond noise is unknown (no step-time spread in their rows); {runner}"
        )
    head = f"Margin over the runner-up (trial {r['trial_number']}, {mfu_text(m.runner_up_mfu)})"
    if m.verdict is Verdict.WIN:
        high = "" if m.lead_high is None else f" to {100 * m.lead_high:.1f}%"
        return (
            f"{head}: {points}, a win beyond noise: {100 * (m.lead_low or 0.0):.1f}%{high} between the ends of the "
            f"two intervals ({INTERVAL_NAME}; winner {mfu_text(m.winner_mfu)}); {runner}"
        )
    return (
        f"{head}: none beyond noise, a tie within noise: the winner measured {100 * m.lead:.1f}% faster, but the "
        f"two intervals overlap ({INTERVAL_NAME}, {m.steps_now} measured steps; winner {mfu_text(m.winner_mfu)}); "
        f"{m.settle()} The {runner}"
    )


def cell_kinds(df: pd.DataFrame, plan: Plan, attn: str, ckpt: str, nodes: int | None = None) -> pd.DataFrame:
    """Each (tp, pp) cell of one attention kernel x checkpointing mode: best MFU, or why there is none;
    `nodes`: of the trials and layouts at that node count only (a sweep over several).

    `kind` is "ok" (best MFU over the other knobs), a failure status when every trial there failed
    ("oom", "failed", ...), "not run" (a candidate the search did not try), "pruned" (valid but
    predicted over memory) or "invalid" (no valid layout in the cell).
    """
    import pandas as pd

    tps = sorted({int(v) for v in plan.cols["tp"]})
    pps = sorted({int(v) for v in plan.cols["pp"]})
    here = df[(df["attention"] == attn) & (df["activation_checkpointing"] == ckpt)]
    in_combo = (plan.cols["attention"] == attn) & (plan.cols["activation_checkpointing"] == ckpt)
    if nodes is not None:
        here, in_combo = here[here["nodes"] == nodes], in_combo & (plan.nodes == nodes)
    cells = []
    for tp in tps:
        for pp in pps:
            trials = here[(here["tp"] == tp) & (here["pp"] == pp)]
            ok = trials[(trials["status"] == TrialStatus.OK) & trials["mfu"].notna()]
            statuses = set(plan.status[in_combo & (plan.cols["tp"] == tp) & (plan.cols["pp"] == pp)])
            kind: str
            if len(ok):
                kind, mfu = TrialStatus.OK, float(ok["mfu"].max())
            elif len(trials):
                kind, mfu = Counter(trials["status"]).most_common(1)[0][0], math.nan
            elif PlanStatus.CANDIDATE in statuses:
                kind, mfu = "not run", math.nan
            elif PlanStatus.PRUNED in statuses:
                kind, mfu = PlanStatus.PRUNED, math.nan
            else:
                kind, mfu = PlanStatus.INVALID, math.nan
            cells.append({"tp": tp, "pp": pp, "kind": str(kind), "mfu": mfu})
    return pd.DataFrame(cells)


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rho (ties by order); None with fewer than 3 points or a constant side."""
    if len(a) < 3:
        return None
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def varying_knobs(df: pd.DataFrame) -> list[str]:
    """The knobs (and dp) that take more than one value among the trials: what tells layouts apart
    (etp only where it departs from tp: `knobs.shown_in_tables`)."""
    cols = [k for k in [*KNOBS, "dp"] if k in df]
    rows = df[cols].to_dict("records")
    return [k for k in cols if df[k].nunique(dropna=True) > 1 and shown_in_tables(k, rows)]


def short_layout(row: Any, knobs: list[str]) -> str:
    return " ".join(f"{label(k)}={fmt_value(row[k])}" for k in knobs) or "the only layout"


@dataclass(frozen=True)
class MemoryPoints:
    """Measured allocator peaks against the estimate's tensor terms (GiB per device), one per trial.

    `skipped` says why there are no points (empty when there are).
    """

    skipped: str = ""
    trials: np.ndarray | None = None  # trial numbers, the points' labels
    tensors_gib: np.ndarray | None = None  # the estimate without its fixed per-process overhead
    measured_gib: np.ndarray | None = None
    budget_gib: float = math.nan  # the card less the median overhead: what tensors may use


def memory_points(df: pd.DataFrame, plan: Plan, sweep: Sweep) -> MemoryPoints:
    """The estimate's tensor terms (weights, grads, optimizer state, activations, logits; the fixed
    per-process overhead left out, since an allocator never sees it) against each measured peak."""
    ran = df[df["peak_mem_gib"].notna()]
    cpu = ran["device"].fillna("").astype(str).str.startswith("cpu").any() or sweep.cluster.gpu.name == "cpu"
    if cpu:
        return MemoryPoints(
            "Not plotted: on CPU the measured number is the growth of the process's resident "
            "set (RSS) above a baseline, not an allocator peak, so it cannot be compared with the estimate."
        )
    idx = match_plan_rows(plan, ran) if len(ran) else None
    if idx is None:
        return MemoryPoints(
            "skipped: no trial measured its peak"
            if ran.empty
            else "skipped: results could not be matched to the plan's layouts by knob values"
        )
    mem = plan.memory
    return MemoryPoints(
        trials=ran["trial_number"].to_numpy(),
        tensors_gib=(mem.total - mem.overhead)[idx] / GIB,
        measured_gib=ran["peak_mem_gib"].to_numpy(float),
        budget_gib=(mem.capacity_bytes - float(np.median(mem.overhead[idx]))) / GIB,
    )


@dataclass(frozen=True)
class MfuPoints:
    """The dry run's predicted MFU (uncalibrated) against the measured one, one point per ok trial."""

    skipped: str = ""  # why there are no points (empty when there are)
    trials: np.ndarray | None = None
    predicted: np.ndarray | None = None
    measured: np.ndarray | None = None
    rank_correlation: float | None = None
    low: np.ndarray | None = None  # each trial's MFU at the ends of its 95 % interval (the measured MFU where unknown)
    high: np.ndarray | None = None


def mfu_points(df: pd.DataFrame, plan: Plan, sweep: Sweep) -> MfuPoints:
    """Measured MFU of every successful trial beside the throughput model's, matched to plan rows by knobs."""
    from sweeper.report.sizes_data import predict_at_sizes

    ok = successful(df)
    idx = match_plan_rows(plan, ok) if len(ok) else None
    if idx is None:
        return MfuPoints(
            "skipped: results could not be matched to the plan's layouts by knob values "
            "(the sweep file changed since the run?)"
            if len(ok)
            else "skipped: no successful trial"
        )
    predicted = predict_at_sizes(plan.cols, sweep).mfu[idx]  # each trial at the node count it ran at
    measured = ok["mfu"].to_numpy(float)
    low, high = interval_ends(ok)
    return MfuPoints(
        "", ok["trial_number"].to_numpy(), predicted, measured, rank_correlation(predicted, measured), low, high
    )


def interval_ends(ok: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The MFU at the ends of each ok trial's 95 % interval (`mfu_low`, `mfu_high`); the measured MFU
    where a trial has none (too few steps, or an interval reaching 0 s at the top)."""
    mfu = ok["mfu"].to_numpy(float)
    low = ok["mfu_low"].to_numpy(float) if "mfu_low" in ok else np.full_like(mfu, np.nan)
    high = ok["mfu_high"].to_numpy(float) if "mfu_high" in ok else np.full_like(mfu, np.nan)
    return np.where(np.isnan(low), mfu, low), np.where(np.isnan(high), mfu, high)


def colour_scale(df: pd.DataFrame) -> tuple[float, float]:
    """The heatmaps' MFU % scale: from the lowest to the highest MFU the ok trials' intervals allow,
    so that a tie within noise is not painted as the scale's two extremes."""
    ok = successful(df)
    ok = ok[ok["mfu"].notna()]
    if ok.empty:
        return 0.0, 1.0
    low, high = interval_ends(ok)
    lo, hi = 100 * float(low.min()), 100 * float(high.max())
    return (lo, hi) if hi > lo else (lo, lo + 1.0)


def layout_counts(df: pd.DataFrame, plan: Plan) -> dict[str, int]:
    """The plan's layouts by what became of them: candidates run and not run (uncertain ones, which
    may run, among them), pruned, invalid."""
    counts = plan.counts()
    cands = counts.get(CANDIDATE, 0) + counts.get(PlanStatus.UNCERTAIN, 0)
    return {
        "candidate, run": min(len(df), cands),
        "candidate, not run": max(cands - len(df), 0),
        "pruned (memory)": counts.get(PlanStatus.PRUNED, 0),
        PlanStatus.INVALID: counts.get(PlanStatus.INVALID, 0),
    }
