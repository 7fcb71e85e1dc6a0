"""Why the winner wins: the throughput model's step-time parts of the top layouts, and a sentence
per runner-up naming the part (and the knobs behind it) that costs it most. Pure: no matplotlib."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.plan.plan import Plan
from sweeper.report.data import fmt_value, match_plan_rows, short_layout
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus

if TYPE_CHECKING:
    import pandas as pd

TOP_EXPLAINED = 5


@dataclass(frozen=True)
class Explained:
    """The throughput model's step-time breakdown of the top layouts, calibrated to their measurements."""

    trials: pd.DataFrame  # the top ok trials, best first
    parts: dict[str, np.ndarray]  # seconds per step by estimate.step_time part, one entry per trial
    predicted_s: np.ndarray  # the sum of the exposed parts


def explain_top(
    df: pd.DataFrame, plan: Plan, sweep: Sweep, top: int = TOP_EXPLAINED, ranked: list[int] | None = None
) -> Explained | None:
    """Breakdown of the top ok trials with measured step times, each priced at the node count it ran
    at; None when they cannot be matched to the plan. `ranked`: the trial numbers of the sweep's
    answer, best first (over several node counts, the trials of the size it answers for); else by MFU."""
    from sweeper.estimate.flops import model_flops_per_token
    from sweeper.estimate.step_time import HIDDEN_PARTS, PARTS, calibrate
    from sweeper.report.sizes_data import breakdown_at_sizes, predict_at_sizes

    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna() & (df["mfu"] > 0)].copy()
    ok = ok.sort_values(["mfu", "trial_number"], ascending=[False, True])
    # a row with MFU but no step times (a replayed table): its step time follows from MFU's definition
    step_flops = model_flops_per_token(sweep.model, sweep.seq_len) * sweep.global_batch_size * sweep.seq_len
    world = ok["nodes"] * sweep.cluster.gpus_per_node if "nodes" in ok else sweep.cluster.world
    ok["step_time_mean_s"] = ok["step_time_mean_s"].fillna(
        step_flops / (ok["mfu"] * world * sweep.cluster.gpu.peak_flops(sweep.trial.precision))
    )
    idx = match_plan_rows(plan, ok) if len(ok) else None
    if idx is None:
        return None
    model = predict_at_sizes(plan.cols, sweep)
    # the scales fitted to every measured step time, so bars and measurements share one scale
    calibration = calibrate(model, [int(i) for i in idx], ok["step_time_mean_s"].tolist())
    if ranked is not None:  # the answer's trials, in its order
        place = {t: i for i, t in enumerate(ranked)}
        keep = ok["trial_number"].map(place).notna().to_numpy()
        order = np.argsort(ok["trial_number"][keep].map(place).to_numpy(), kind="stable")
        ok, idx = ok[keep].iloc[order], idx[keep][order]
        if ok.empty:
            return None
    rows = idx[:top]
    cols = {k: v[rows] for k, v in plan.cols.items()}
    parts = breakdown_at_sizes(cols, sweep, calibration)
    predicted = sum(parts[k] for k in PARTS if k not in HIDDEN_PARTS)
    return Explained(ok.head(top).reset_index(drop=True), parts, np.asarray(predicted))


@dataclass(frozen=True)
class Segment:
    """One piece of a modelled bar of "Why the winner wins": a part of one trial's step, in seconds."""

    row: int  # the trial's place in `Explained.trials`
    part: str  # a estimate.step_time part
    left_s: float
    width_s: float
    hidden: bool  # overlapped with backward: drawn inside the step's span, adding nothing to it


def bar_segments(ex: Explained) -> list[Segment]:
    """The bars' pieces: each trial's exposed parts end to end, so its bar is exactly its modelled step
    (`predicted_s`), and its hidden traffic ending with the step, inside it (it runs under backward)."""
    from sweeper.estimate.step_time import HIDDEN_PARTS, PARTS

    out = []
    for i in range(len(ex.trials)):
        left = 0.0
        for k in PARTS:
            w = float(ex.parts[k][i])
            if w > 0 and k not in HIDDEN_PARTS:
                out.append(Segment(i, k, left, w, hidden=False))
                left += w
        end = float(ex.predicted_s[i])
        for k in HIDDEN_PARTS:
            w = min(float(ex.parts[k][i]), end)
            if w > 0:
                out.append(Segment(i, k, end - w, w, hidden=True))
                end -= w
    return out


def order_sentence(ex: Explained) -> str | None:
    """Where the calibrated model puts the winner's step above a slower-measured trial's, the section
    says so first: the bars then show the model, and the model does not explain the measured order."""
    from sweeper.results.noise import Verdict, margin

    w = ex.trials.iloc[0]
    faster = [i for i in range(1, len(ex.trials)) if ex.predicted_s[i] < ex.predicted_s[0]]
    if not faster:
        return None
    others = " and ".join(
        f"trial {ex.trials.iloc[i]['trial_number']} ({ex.predicted_s[i]:.3g} s modelled, "
        f"{ex.trials.iloc[i]['step_time_mean_s']:.3g} s measured)"
        for i in faster
    )
    noise = {  # of the runner-up, where the model has it faster: does the measured order itself hold?
        Verdict.TIE: " The winner and the runner-up measured within noise of each other: the measured order may not hold.",
        Verdict.WIN: " The measured gap to the runner-up is beyond noise: something the model lacks sets their order.",
        Verdict.UNKNOWN: "",
    }[margin(w, ex.trials.iloc[1]).verdict if faster[0] == 1 else Verdict.UNKNOWN]
    return (
        f"The model does not explain the measured order: calibrated, it puts the winner's step (trial "
        f"{w['trial_number']}, {ex.predicted_s[0]:.3g} s modelled, {w['step_time_mean_s']:.3g} s measured) above "
        f"that of {others}, which measured slower; the bars below are the model's, not the measurements'.{noise}"
    )


def runner_up_sentences(ex: Explained, knobs: list[str], sweep: Sweep) -> list[str]:
    """One sentence per runner-up: how much slower it measured, and the part of the model that costs it most."""
    from sweeper.estimate.step_time import HIDDEN_PARTS, PART_LABELS, PARTS, model_misses
    from sweeper.results.noise import margin

    w = ex.trials.iloc[0]
    out = []
    miss = model_misses(ex.predicted_s, ex.trials["step_time_mean_s"].to_numpy(float))
    for i in range(1, len(ex.trials)):
        r = ex.trials.iloc[i]
        slower = 100 * (r["step_time_mean_s"] / w["step_time_mean_s"] - 1)
        head = (
            f"#{i + 1} trial {r['trial_number']} ({short_layout(r, knobs)}): {100 * r['mfu']:.1f}% MFU, "
            f"step {r['step_time_mean_s']:.3g} s against the winner's {w['step_time_mean_s']:.3g} s "
            f"({slower:+.1f}% measured{', within noise' if margin(w, r).within_noise() else ''})"
        )
        missed = [(j, ex.trials.iloc[j]) for j in (i, 0) if not np.isnan(miss[j])]
        if missed:
            out.append(
                head
                + "; the calibrated model misses "
                + " and ".join(
                    f"trial {t['trial_number']}'s measured step by {100 * miss[j]:+.0f}% "
                    f"({ex.predicted_s[j]:.3g} s modelled, {t['step_time_mean_s']:.3g} s measured)"
                    for j, t in missed
                )
                + ", so the gap is not attributed to a modelled part."
            )
            continue
        gaps = {k: float(ex.parts[k][i] - ex.parts[k][0]) for k in PARTS if k not in HIDDEN_PARTS}
        part = max(gaps, key=lambda k: gaps[k])
        if gaps[part] <= 0:
            out.append(
                head + "; the model predicts it no slower than the winner "
                f"({ex.predicted_s[i]:.3g} s against {ex.predicted_s[0]:.3g} s): the gap is measured, not modelled."
            )
            continue
        share = 100 * ex.parts[part][i] / ex.predicted_s[i]
        share_w = 100 * ex.parts[part][0] / ex.predicted_s[0]
        out.append(
            f"{head}; what costs it most: {_why(part, r, share, ex.parts, i)} "
            f"(winner: {share_w:.0f}% {PART_LABELS[part]})."
        )
    return out


def _why(part: str, r: Any, share: float, parts: dict[str, np.ndarray], i: int) -> str:
    """The phrase for the part that costs a layout most, naming the knobs behind it."""
    if part == "bubble":
        return f"pp={r['pp']} with {r['grad_accum']} micro-batches adds a {share:.0f}% bubble"
    if part == "recompute":
        of_forward = 100 * parts["recompute"][i] / max(float(parts["forward"][i]), 1e-30)
        return (
            f"{r['activation_checkpointing']} checkpointing recomputes {of_forward:.0f}% of the forward, "
            f"{share:.0f}% of the step"
        )
    if part == "tp_comm":
        return f"tp={r['tp']} spends {share:.0f}% of the step in tensor-parallel all-reduces"
    if part == "pp_comm":
        return f"pp={r['pp']} spends {share:.0f}% of the step sending activations between stages"
    if part == "dp_comm":
        return f"dp={r['dp']} (sharding {r['sharding']}) leaves {share:.0f}% of the step in exposed gradient traffic"
    if part == "matmul":
        return (
            f"smaller GEMMs (mbs={r['micro_batch_size']}, tp={r['tp']}) run below peak: matmuls take "
            f"{share:.0f}% of the step"
        )
    if part == "attention":
        return f"attention={r['attention']} takes {share:.0f}% of the step"
    if part == "optimizer":
        return f"the optimizer step (sharding {r['sharding']}) takes {share:.0f}% of the step"
    if part == "memory_bound":
        return (
            f"memory-bound norms and elementwise work (rmsnorm={r['rmsnorm']}, sp={fmt_value(r['sequence_parallel'])}) "
            f"take {share:.0f}% of the step"
        )
    if part == "framework":
        return f"launch overhead of {r['grad_accum']} micro-batches takes {share:.0f}% of the step"
    from sweeper.estimate.step_time import PART_LABELS

    return f"{PART_LABELS.get(part, part)} takes {share:.0f}% of the step"  # a part added to the model later
