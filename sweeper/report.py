"""`sweep report`: a self-contained HTML page and PNG plots from a sweep's results and its plan.

The page opens offline: every plot is a PNG beside it and is also embedded as a base64 data URI;
there is no script and no stylesheet from anywhere. matplotlib is imported only when plotting.
"""

from __future__ import annotations

import base64
import html
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.files import atomic_write_text
from sweeper.hardware import GIB
from sweeper.knobs import KNOBS, label
from sweeper.layout import RULE_SUMMARIES
from sweeper.plan import CANDIDATE, Plan
from sweeper.spec import Sweep
from sweeper.statuses import PlanReason, PlanStatus, TrialStatus

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

STATUS_COLORS: dict[str, str] = {
    TrialStatus.OK: "tab:green",
    TrialStatus.OOM: "tab:red",
    TrialStatus.TIMEOUT: "tab:orange",
    TrialStatus.FAILED: "black",
    TrialStatus.KERNEL_UNAVAILABLE: "tab:purple",
}


@dataclass(frozen=True)
class Plot:
    """One PNG of the report: its file name, a heading, and a caption (why it is there or why empty)."""

    file: str
    title: str
    caption: str = ""


def layout_text(row: Any) -> str:
    """A layout in one line: tp, pp, dp, mbs, grad_accum, then every other knob (`knob=value`)."""
    base = [
        f"tp={row['tp']}",
        f"pp={row['pp']}",
        f"dp={row['dp']}",
        f"mbs={row['micro_batch_size']}",
        f"grad_accum={row['grad_accum']}",
    ]
    rest = [f"{label(k)}={_fmt(row[k])}" for k in KNOBS if k not in ("tp", "pp", "micro_batch_size")]
    return " ".join(base + rest)


def _fmt(v: Any) -> str:
    return str(bool(v)).lower() if isinstance(v, (bool, np.bool_)) else str(v)


def match_plan_rows(plan: Plan, df: pd.DataFrame) -> np.ndarray | None:
    """For each result row, the index of the plan row with the same knob values; None if any is missing."""
    index = {tuple(_fmt(plan.cols[k][i]) for k in KNOBS): i for i in range(len(plan))}
    found = [index.get(tuple(_fmt(r[k]) for k in KNOBS)) for _, r in df.iterrows()]
    if not found or any(i is None for i in found):
        return None
    return np.asarray(found, dtype=np.int64)


def gpu_hours(df: pd.DataFrame) -> np.ndarray:
    """Cumulative GPU-hours in trial order: num_devices x (finished_at - started_at); unknown spans count 0."""
    span_s = (df["finished_at"] - df["started_at"]).dt.total_seconds().fillna(0.0).clip(lower=0.0)
    return np.cumsum(df["num_devices"].fillna(0).to_numpy(float) * span_s.to_numpy(float) / 3600.0)


def summary_lines(sweep: Sweep, plan: Plan, df: pd.DataFrame) -> list[str]:
    """The page's opening text: winner and layout, margin over the runner-up, coverage, pruned and why."""
    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()].sort_values(
        ["mfu", "trial_number"], ascending=[False, True]
    )
    lines = []
    if len(ok):
        w = ok.iloc[0]
        lines.append(f"Winner: trial {w['trial_number']} at {100 * w['mfu']:.2f}% MFU — {layout_text(w)}")
        if len(ok) > 1:
            r = ok.iloc[1]
            lines.append(
                f"Margin over the runner-up (trial {r['trial_number']}, {100 * r['mfu']:.2f}% MFU): "
                f"{100 * (w['mfu'] - r['mfu']):.2f} points, {100 * (w['mfu'] / r['mfu'] - 1):.1f}% faster; "
                f"runner-up: {layout_text(r)}"
            )
        else:
            lines.append("No runner-up: only one trial succeeded.")
    else:
        lines.append("No successful trial yet.")
    counts = plan.counts()
    cands = counts.get(CANDIDATE, 0)
    share = f" ({100 * len(df) / cands:.0f}%)" if cands else ""
    statuses = ", ".join(f"{k} {v}" for k, v in Counter(df["status"]).most_common())
    lines.append(
        f"Grid run: {len(df)} trials of {cands} candidate layouts{share}; "
        f"{len(plan)} layouts in the cross product. Trials: {statuses or 'none'}."
    )
    stopped = df[df["status"] == TrialStatus.STOPPED_EARLY]
    if len(stopped):
        saved = stopped["gpu_hours_saved"].fillna(0).sum() if "gpu_hours_saved" in stopped else 0.0
        lines.append(
            f"Stopped early (clearly slower than the best so far): {len(stopped)} trials, {saved:.1f} GPU-hours saved."
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


# ---- plots ------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, out_dir: Path, name: str) -> str:
    fig.savefig(out_dir / name, dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return name


def cell_kinds(df: pd.DataFrame, plan: Plan, attn: str, ckpt: str) -> pd.DataFrame:
    """Each (tp, pp) cell of one attention kernel x checkpointing mode: best MFU, or why there is none.

    `kind` is "ok" (best MFU over the other knobs), a failure status when every trial there failed
    ("oom", "failed", ...), "not run" (a candidate the search did not try), "pruned" (valid but
    predicted over memory) or "invalid" (no valid layout in the cell).
    """
    import pandas as pd

    tps = sorted({int(v) for v in plan.cols["tp"]})
    pps = sorted({int(v) for v in plan.cols["pp"]})
    here = df[(df["attention"] == attn) & (df["activation_checkpointing"] == ckpt)]
    in_combo = (plan.cols["attention"] == attn) & (plan.cols["activation_checkpointing"] == ckpt)
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


# fills of cells without a measured MFU; text colour then follows the fill's luminance
EMPTY_FILLS = {
    "not run": "#f2f2f2",
    PlanStatus.PRUNED: "#f6dcb4",
    PlanStatus.INVALID: "#bdbdbd",
    TrialStatus.OOM: "#f4b6b6",
    TrialStatus.FAILED: "#d9a0a0",
    TrialStatus.TIMEOUT: "#f8cf9c",
    TrialStatus.KERNEL_UNAVAILABLE: "#d7c4ea",
}


def text_color(rgb: Any) -> str:
    """Black on light backgrounds, white on dark ones (WCAG relative luminance of sRGB)."""
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in list(rgb)[:3]]
    return "black" if 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] > 0.179 else "white"


def plot_heatmaps(df: pd.DataFrame, plan: Plan, out_dir: Path) -> list[Plot]:
    """The paper's tp x pp view: best MFU per cell, one heatmap per attention kernel x checkpointing mode
    that has trials; cells without a measurement say why (not run, pruned, invalid, OOM, failed)."""
    plt = _pyplot()
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    plots = []
    measured = 100 * df.loc[(df["status"] == TrialStatus.OK) & df["mfu"].notna(), "mfu"].to_numpy(float)
    lo, hi = (float(measured.min()), float(measured.max())) if measured.size else (0.0, 1.0)
    hi = hi if hi > lo else lo + 1.0  # one colour scale for every heatmap, so colours compare across them
    for (attn, ckpt), _ in df.groupby(["attention", "activation_checkpointing"], sort=True):
        cells = cell_kinds(df, plan, str(attn), str(ckpt))
        tps, pps = sorted(cells["tp"].unique()), sorted(cells["pp"].unique())
        grid = cells.pivot(index="tp", columns="pp", values="mfu").loc[tps, pps].to_numpy(float) * 100
        kinds = cells.pivot(index="tp", columns="pp", values="kind").loc[tps, pps].to_numpy()
        fig, ax = plt.subplots(figsize=(2.2 + 1.2 * len(pps), 1.4 + 0.6 * len(tps)))
        cmap = plt.get_cmap("viridis")
        im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, vmin=lo, vmax=hi, origin="lower", aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            kind = kinds[i, j]
            if kind == TrialStatus.OK:
                rgb, text = im.cmap(im.norm(v))[:3], f"{v:.1f}"
            else:
                rgb, text = (
                    to_rgb(EMPTY_FILLS.get(kind, "#ffffff")),
                    kind.replace(TrialStatus.KERNEL_UNAVAILABLE, "no kernel"),
                )
                ax.add_patch(
                    Rectangle(
                        (j - 0.5, i - 0.5),
                        1,
                        1,
                        facecolor=rgb,
                        edgecolor="white",
                        hatch="//" if kind == PlanStatus.INVALID else None,
                    )
                )
            ax.text(
                j,
                i,
                text,
                ha="center",
                va="center",
                fontsize=9 if kind == TrialStatus.OK else 8,
                color=text_color(rgb),
                fontweight="bold" if kind == TrialStatus.OK else "normal",
            )
        ax.set_xticks(range(len(pps)), [str(c) for c in pps])
        ax.set_yticks(range(len(tps)), [str(t) for t in tps])
        ax.set_xlabel("pp")
        ax.set_ylabel("tp")
        fig.colorbar(im, ax=ax, label="best MFU %")
        ax.set_title(f"attention={attn}, checkpointing={ckpt}", fontsize=10)
        name = _save(fig, out_dir, f"heatmap_{attn}_{ckpt}.png")
        plots.append(
            Plot(
                name,
                f"MFU by tp × pp — attention {attn}, checkpointing {ckpt}",
                "best MFU (%) over the other knobs in each cell, one colour scale for all; a cell without one says why: "
                "not run (a candidate the search left), pruned (predicted over memory), invalid "
                "(hatched: no valid layout), or the status every trial there ended with",
            )
        )
    return plots


def plot_mfu_vs_mbs(df: pd.DataFrame, out_dir: Path) -> Plot | None:
    """The paper's micro-batch view: best MFU against micro-batch size, one line per attention kernel,
    one panel per checkpointing mode."""
    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()]
    if ok.empty:
        return None
    plt = _pyplot()
    modes = sorted(ok["activation_checkpointing"].unique())
    fig, axes = plt.subplots(1, len(modes), figsize=(4.6 * len(modes) + 0.6, 3.8), sharey=True, squeeze=False)
    sizes = sorted(ok["micro_batch_size"].unique())
    for ax, mode in zip(axes[0], modes):
        part = ok[ok["activation_checkpointing"] == mode]
        for attn, by_attn in part.groupby("attention", sort=True):
            best = by_attn.groupby("micro_batch_size")["mfu"].max()
            ax.plot(best.index, 100 * best.to_numpy(float), marker="o", label=str(attn))
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [str(m) for m in sizes])
        ax.minorticks_off()
        ax.set_xlabel("micro-batch size")
        ax.set_title(f"checkpointing: {mode}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, title="attention", title_fontsize=8)
    axes[0][0].set_ylabel("best MFU %")
    return Plot(
        _save(fig, out_dir, "mfu_vs_mbs.png"),
        "MFU against micro-batch size, per attention kernel",
        "best MFU over the other knobs (tp, pp, ...) at each micro-batch size; one panel per checkpointing mode",
    )


def plot_memory(df: pd.DataFrame, plan: Plan, sweep: Sweep, out_dir: Path) -> Plot:
    """Measured allocator peak against the estimate's tensor terms (weights, grads, optimizer state,
    activations, logits: the fixed per-process overhead left out, since an allocator never sees it)."""
    title = "Memory: measured allocated peak against the estimate's tensors"
    ran = df[df["peak_mem_gib"].notna()]
    cpu = ran["device"].fillna("").astype(str).str.startswith("cpu").any() or sweep.cluster.gpu.name == "cpu"
    if cpu:
        return Plot(
            "",
            title,
            "Not plotted: on CPU the measured number is the growth of the process's resident "
            "set (RSS) above a baseline, not an allocator peak, so it cannot be compared with the estimate.",
        )
    idx = match_plan_rows(plan, ran) if len(ran) else None
    if idx is None:
        return Plot(
            "",
            title,
            "skipped: no trial measured its peak"
            if ran.empty
            else "skipped: results could not be matched to the plan's layouts by knob values",
        )
    mem = plan.memory
    tensors = (mem.total - mem.overhead)[idx] / GIB
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 5.0))
    measured = ran["peak_mem_gib"].to_numpy(float)
    ax.scatter(tensors, measured, color="tab:blue")
    for x, y, t in zip(tensors, measured, ran["trial_number"]):
        ax.annotate(str(t), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    top = max(float(tensors.max()), float(measured.max())) * 1.1
    ax.plot([0, top], [0, top], color="gray", linestyle=":", label="measured = estimate")
    budget = (mem.capacity_bytes - float(np.median(mem.overhead[idx]))) / GIB
    if budget < 3 * top:
        ax.axhline(budget, color="tab:red", linestyle="--", label=f"usable for tensors {budget:.1f} GiB")
    ax.set_xlabel("estimate: tensor terms, GiB per device (no fixed overhead)")
    ax.set_ylabel("measured: allocator max allocated, GiB per device")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ratio = measured / np.maximum(tensors, 1e-9)
    return Plot(
        _save(fig, out_dir, "memory_pred_vs_measured.png"),
        title,
        f"labels are trial numbers; measured / estimate: median {np.median(ratio):.2f}, "
        f"range {ratio.min():.2f}–{ratio.max():.2f}",
    )


def plot_mfu_pred(df: pd.DataFrame, plan: Plan, sweep: Sweep, out_dir: Path) -> Plot:
    """The dry run's predicted MFU (perfmodel) against the measured one, matched to plan rows by knobs."""
    from sweeper.perfmodel import predict

    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()]
    idx = match_plan_rows(plan, ok) if len(ok) else None
    title = "Predicted against measured MFU"
    if idx is None:
        return Plot(
            "",
            title,
            "skipped: results could not be matched to the plan's layouts by knob values "
            "(the sweep file changed since the run?)"
            if len(ok)
            else "skipped: no successful trial",
        )
    predicted = predict(plan.cols, sweep).mfu[idx]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 5.0))
    ax.scatter(100 * predicted, 100 * ok["mfu"].to_numpy(float), color="tab:blue")
    for p, m, t in zip(predicted, ok["mfu"], ok["trial_number"]):
        ax.annotate(str(t), (100 * p, 100 * m), fontsize=7, xytext=(3, 3), textcoords="offset points")
    top = 100 * max(predicted.max(), ok["mfu"].max()) * 1.1
    ax.plot([0, top], [0, top], color="gray", linestyle=":", label="measured = predicted")
    ax.set_xlabel("predicted MFU % (dry run, uncalibrated)")
    ax.set_ylabel("measured MFU %")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    rho = _rank_correlation(predicted, ok["mfu"].to_numpy(float))
    caption = "labels are trial numbers" + (f"; Spearman rank correlation {rho:.2f}" if rho is not None else "")
    return Plot(_save(fig, out_dir, "mfu_pred_vs_measured.png"), title, caption)


def _rank_correlation(a: np.ndarray, b: np.ndarray) -> float | None:
    """Spearman's rho (ties by order); None with fewer than 3 points or a constant side."""
    if len(a) < 3:
        return None
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def plot_progress(df: pd.DataFrame, out_dir: Path) -> Plot | None:
    """Best MFU so far against trial number and against GPU-hours spent (failed trials count as 0)."""
    if df.empty:
        return None
    plt = _pyplot()
    ordered = df.sort_values("trial_number")
    best = np.maximum.accumulate(
        100 * ordered["mfu"].where(ordered["status"] == TrialStatus.OK).fillna(0.0).to_numpy(float)
    )
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    a1.step(ordered["trial_number"], best, where="post", marker="o")
    a1.set_xlabel("trial number")
    a1.set_ylabel("best MFU so far %")
    a2.step(gpu_hours(ordered), best, where="post", marker="o", color="tab:orange")
    a2.set_xlabel("GPU-hours (devices × wall time)")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
    return Plot(_save(fig, out_dir, "progress.png"), "Search progress", "best MFU so far; failed trials count as 0")


def plot_status(df: pd.DataFrame, plan: Plan, out_dir: Path) -> Plot:
    """Trials by status beside the plan's layouts by status, on linear axes with the counts written."""
    plt = _pyplot()
    trials = Counter(df["status"])
    counts = plan.counts()
    cands = counts.get(CANDIDATE, 0)
    layouts = {
        "candidate, run": min(len(df), cands),
        "candidate, not run": max(cands - len(df), 0),
        "pruned (memory)": counts.get(PlanStatus.PRUNED, 0),
        PlanStatus.INVALID: counts.get(PlanStatus.INVALID, 0),
    }
    from matplotlib.ticker import MaxNLocator

    fig, (a1, a2) = plt.subplots(
        1, 2, figsize=(11, 0.9 + 0.45 * max(len(trials), len(layouts), 2)), gridspec_kw={"wspace": 0.55}
    )  # room for the right panel's labels
    names = [str(n) for n, _ in trials.most_common()] or ["none"]
    bars = [
        (
            "trials by status",
            a1,
            names,
            [trials.get(n, 0) for n in names],
            [STATUS_COLORS.get(n, "gray") for n in names],
        ),
        (
            "layouts of the plan",
            a2,
            list(layouts),
            list(layouts.values()),
            ["tab:green", "#b8b8b8", "tab:orange", "dimgray"],
        ),
    ]
    for title, ax, labels, values, colors in bars:
        ax.barh(labels, values, color=colors, height=0.6)
        ax.invert_yaxis()
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlim(0, max(max(values), 1) * 1.18)
        for i, v in enumerate(values):
            ax.text(v, i, f" {v}", va="center", fontsize=10)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="y", labelsize=10)
        ax.grid(axis="x", alpha=0.3)
    return Plot(_save(fig, out_dir, "status.png"), "Status breakdown", "linear axes; counts at the bar ends")


# ---- why the winner wins ---------------------------------------------------------------
TOP_EXPLAINED = 5


@dataclass(frozen=True)
class Explained:
    """The throughput model's step-time breakdown of the top layouts, calibrated to their measurements."""

    trials: pd.DataFrame  # the top ok trials, best first
    parts: dict[str, np.ndarray]  # seconds per step by perfmodel part, one entry per trial
    predicted_s: np.ndarray  # the sum of the exposed parts


def varying_knobs(df: pd.DataFrame) -> list[str]:
    """The knobs (and dp) that take more than one value among the trials: what tells layouts apart."""
    cols = [*KNOBS, "dp"]
    return [k for k in cols if k in df and df[k].nunique(dropna=True) > 1]


def short_layout(row: Any, knobs: list[str]) -> str:
    return " ".join(f"{label(k)}={_fmt(row[k])}" for k in knobs) or "the only layout"


def explain_top(df: pd.DataFrame, plan: Plan, sweep: Sweep, top: int = TOP_EXPLAINED) -> Explained | None:
    """Breakdown of the top ok trials with measured step times; None when they cannot be matched to the plan."""
    from sweeper.flops import model_flops_per_token
    from sweeper.perfmodel import PARTS, breakdown, calibrate, predict

    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna() & (df["mfu"] > 0)].copy()
    ok = ok.sort_values(["mfu", "trial_number"], ascending=[False, True])
    # a row with MFU but no step times (a replayed table): its step time follows from MFU's definition
    step_flops = model_flops_per_token(sweep.model, sweep.seq_len) * sweep.global_batch_size * sweep.seq_len
    ok["step_time_mean_s"] = ok["step_time_mean_s"].fillna(
        step_flops / (ok["mfu"] * sweep.cluster.world * sweep.cluster.gpu.peak_flops(sweep.trial.precision))
    )
    idx = match_plan_rows(plan, ok) if len(ok) else None
    if idx is None:
        return None
    model = predict(plan.cols, sweep)
    # the scales fitted to every measured step time, so bars and measurements share one scale
    calibration = calibrate(model, [int(i) for i in idx], ok["step_time_mean_s"].tolist())
    rows = idx[:top]
    cols = {k: v[rows] for k, v in plan.cols.items()}
    parts = breakdown(cols, sweep, calibration)
    predicted = sum(parts[k] for k in PARTS if k != "dp_hidden")
    return Explained(ok.head(top).reset_index(drop=True), parts, np.asarray(predicted))


def plot_breakdown(ex: Explained, knobs: list[str], out_dir: Path) -> Plot:
    """Per top layout: the model's stacked step time (exposed parts; hidden DP traffic hatched after
    it) and, below it, the measured step time."""
    from sweeper.perfmodel import PART_LABELS, PARTS

    plt = _pyplot()
    n = len(ex.trials)
    fig, ax = plt.subplots(figsize=(10.5, 1.2 + 1.05 * n))
    colors = dict(
        zip(
            PARTS,
            [
                "#4c72b0",
                "#55a868",
                "#8172b2",
                "#cccc66",
                "#c44e52",
                "#dd8452",
                "#64b5cd",
                "#937860",
                "#da8bc3",
                "#f2c6e4",
            ],
        )
    )
    labels = []
    for i, (_, r) in enumerate(ex.trials.iterrows()):
        y = 2.6 * i
        left = 0.0
        for k in PARTS:
            w = float(ex.parts[k][i])
            if w <= 0:
                continue
            ax.barh(
                y,
                w,
                left=left,
                color=colors[k],
                edgecolor="white",
                linewidth=0.5,
                hatch="//" if k == "dp_hidden" else None,
                label=PART_LABELS[k],
            )
            left += w
        ax.barh(y + 1, float(r["step_time_mean_s"]), color="#333333", height=0.8)
        ax.text(
            float(r["step_time_mean_s"]), y + 1, f"  measured {r['step_time_mean_s']:.3g} s", va="center", fontsize=8
        )
        ax.text(float(ex.predicted_s[i]), y, f"  model {ex.predicted_s[i]:.3g} s", va="center", fontsize=8)
        labels.append(
            (y + 0.5, f"#{i + 1} trial {r['trial_number']} ({100 * r['mfu']:.1f}% MFU)\n{short_layout(r, knobs)}")
        )
    ax.set_yticks([y for y, _ in labels], [t for _, t in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per optimizer step")
    from matplotlib.patches import Patch

    used = [k for k in PARTS if float(ex.parts[k].max()) > 0]  # the legend in the bars' order
    ax.legend(
        [Patch(facecolor=colors[k], hatch="//" if k == "dp_hidden" else None) for k in used],
        [PART_LABELS[k] for k in used],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    ax.set_xlim(
        0,
        max(float(ex.predicted_s.max() + ex.parts["dp_hidden"].max()), float(ex.trials["step_time_mean_s"].max()))
        * 1.25,
    )
    ax.grid(axis="x", alpha=0.3)
    return Plot(
        _save(fig, out_dir, "step_breakdown.png"),
        "Why the winner wins: step-time breakdown",
        "upper bar of each pair: the throughput model (sweeper/perfmodel.py) split into its parts, "
        "calibrated to the measured step times of every successful trial; hatched: data-parallel traffic "
        "hidden behind backward (not on the step's path). Lower, dark bar: the measured mean step time "
        "(for a row with only an MFU, the step time that MFU implies).",
    )


def runner_up_sentences(ex: Explained, knobs: list[str], sweep: Sweep) -> list[str]:
    """One sentence per runner-up: how much slower it measured, and the part of the model that costs it most."""
    from sweeper.perfmodel import PART_LABELS, PARTS

    w = ex.trials.iloc[0]
    out = []
    for i in range(1, len(ex.trials)):
        r = ex.trials.iloc[i]
        slower = 100 * (r["step_time_mean_s"] / w["step_time_mean_s"] - 1)
        head = (
            f"#{i + 1} trial {r['trial_number']} ({short_layout(r, knobs)}): {100 * r['mfu']:.1f}% MFU, "
            f"step {r['step_time_mean_s']:.3g} s against the winner's {w['step_time_mean_s']:.3g} s "
            f"({slower:+.1f}% measured)"
        )
        gaps = {k: float(ex.parts[k][i] - ex.parts[k][0]) for k in PARTS if k != "dp_hidden"}
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
    if part == "memory_bound":
        return (
            f"memory-bound norms and elementwise work (rmsnorm={r['rmsnorm']}, sp={_fmt(r['sequence_parallel'])}) "
            f"take {share:.0f}% of the step"
        )
    return f"launch overhead of {r['grad_accum']} micro-batches takes {share:.0f}% of the step"


# ---- the page ---------------------------------------------------------------------------
def write_report(sweep: Sweep, df: pd.DataFrame, out_dir: Path, *, plan: Plan | None = None) -> tuple[Path, list[str]]:
    """Write the PNGs and report.html into out_dir; returns the HTML's path and the PNG file names."""
    from sweeper.plan import make_plan

    plan = plan or make_plan(sweep)
    out_dir.mkdir(parents=True, exist_ok=True)
    knobs = varying_knobs(df)
    ex = explain_top(df, plan, sweep)
    why: list[Plot | str] = []
    if ex is not None:
        why = [plot_breakdown(ex, knobs, out_dir), *runner_up_sentences(ex, knobs, sweep)]
    elif len(df[df["status"] == TrialStatus.OK]):
        why = [
            (
                "No step-time breakdown: the results could not be matched to the plan's layouts by knob values "
                "(the sweep file changed since the run?) or no successful trial measured its step time."
            )
        ]
    plots = [
        *plot_heatmaps(df, plan, out_dir),
        plot_mfu_vs_mbs(df, out_dir),
        plot_memory(df, plan, sweep, out_dir),
        plot_mfu_pred(df, plan, sweep, out_dir),
        plot_progress(df, out_dir),
        plot_status(df, plan, out_dir),
    ]
    shown = [p for p in plots if p is not None]
    page = render_html(sweep, summary_lines(sweep, plan, df), shown, df, out_dir, why=why, plan=plan, knobs=knobs)
    path = out_dir / "report.html"
    atomic_write_text(path, page)
    files = [p.file for p in [*shown, *(w for w in why if isinstance(w, Plot))] if p.file]
    return path, files


def render_html(
    sweep: Sweep,
    summary: list[str],
    plots: list[Plot],
    df: pd.DataFrame,
    out_dir: Path,
    *,
    why: list[Plot | str] | None = None,
    plan: Plan | None = None,
    knobs: list[str] | None = None,
) -> str:
    """The page: summary, why the winner wins, top layouts, failures, then each plot (or its note when skipped)."""
    esc = html.escape
    knobs = varying_knobs(df) if knobs is None else knobs
    parts = [
        f"<h1>sweep report: {esc(sweep.name)}</h1>",
        f"<p class=meta>{esc(_describe(sweep))}</p>",
        "<ul class=summary>",
    ]
    parts += [f"<li>{esc(line)}</li>" for line in summary]
    parts.append("</ul>")
    if why:
        parts.append("<h2>Why the winner wins</h2>")
        sentences = [w for w in why if isinstance(w, str)]
        for w in why:
            if isinstance(w, Plot):
                parts += _plot_html(w, out_dir)
        if sentences:
            parts.append("<ul class=why>" + "".join(f"<li>{esc(t)}</li>" for t in sentences) + "</ul>")
    parts += [_top_table(df, knobs, plan), _failures_table(df, knobs)]
    heat = [p for p in plots if p.file.startswith("heatmap_")]
    if heat:  # the paper's tp x pp views side by side, one caption for all
        parts.append("<h2>MFU by tp × pp, per attention kernel and checkpointing mode</h2><div class=heat>")
        for p in heat:
            data = base64.b64encode((out_dir / p.file).read_bytes()).decode("ascii")
            parts.append(f'<img alt="{esc(p.title)}" title="{esc(p.file)}" src="data:image/png;base64,{data}">')
        parts.append(f"</div><p class=caption>{esc(heat[0].caption)}</p>")
    for p in plots:
        if p not in heat:
            parts += [f"<h2>{esc(p.title)}</h2>", *_plot_html(p, out_dir)]
    return _PAGE.format(title=esc(f"sweep report: {sweep.name}"), body="\n".join(parts))


def _plot_html(p: Plot, out_dir: Path) -> list[str]:
    esc = html.escape
    out = []
    if p.file:
        data = base64.b64encode((out_dir / p.file).read_bytes()).decode("ascii")
        out.append(f'<img alt="{esc(p.title)}" src="data:image/png;base64,{data}">')
    if p.caption:
        out.append(f"<p class=caption>{esc(p.caption)}" + (f" (file: {esc(p.file)})" if p.file else "") + "</p>")
    return out


def _describe(sweep: Sweep) -> str:
    m, cl = sweep.model, sweep.cluster
    size = f"{m.num_params / 1e9:.3g}B" if m.num_params >= 1e9 else f"{m.num_params / 1e6:.3g}M"
    return (
        f"{m.name}: {size} parameters, seq {sweep.seq_len}, global batch "
        f"{sweep.global_batch_size}, {cl.nodes}×{cl.gpus_per_node} {cl.gpu.name}, precision {sweep.trial.precision}"
    )


def _top_table(df: pd.DataFrame, knobs: list[str], plan: Plan | None, top: int = 10) -> str:
    """The best trials: the knobs that vary, step time, tokens/s, TFLOP/s per GPU, measured and predicted memory."""
    ok = (
        df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()]
        .sort_values(["mfu", "trial_number"], ascending=[False, True])
        .head(top)
    )
    if ok.empty:
        return ""
    tensors = None
    idx = match_plan_rows(plan, ok) if plan is not None else None
    if plan is not None and idx is not None:
        tensors = (plan.memory.total - plan.memory.overhead)[idx] / GIB
    cpu = ok["device"].fillna("").astype(str).str.startswith("cpu").any()
    head = [
        "#",
        "trial",
        "MFU",
        *(label(k) for k in knobs),
        "step s",
        "tokens/s",
        "TFLOP/s/GPU",
        "measured GiB" + (" (RSS growth)" if cpu else " (allocated)"),
        "predicted GiB (tensors)",
        "predicted GiB (total)",
    ]
    body = []
    for i, (_, r) in enumerate(ok.iterrows()):
        cells = [
            str(i + 1),
            str(r["trial_number"]),
            f"{100 * r['mfu']:.2f}%",
            *(_fmt(r[k]) for k in knobs),
            _num(r["step_time_mean_s"], 3),
            _num(r["tokens_per_s"], 4),
            _num(r["tflops_per_gpu"], 4),
            _num(r["peak_mem_gib"], 3),
            _num(None if tensors is None else float(tensors[i]), 3),
            _num(r["pred_mem_gib"], 3),
        ]
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    note = (
        "<p class=caption>Only the knobs that vary among the trials are shown. Predicted tensors: the "
        "estimate without its fixed per-process overhead, the number an allocator's peak compares with"
        + ("; on CPU the measured number is RSS growth above a baseline, not an allocator peak." if cpu else ".")
        + "</p>"
    )
    return (
        "<h2>Top layouts</h2><table class=top><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + "".join(body)
        + "</table>"
        + note
    )


def _failures_table(df: pd.DataFrame, knobs: list[str]) -> str:
    """Every trial that did not succeed: status, layout, and the first line of its error."""
    bad = df[df["status"] != TrialStatus.OK].sort_values("trial_number")
    if bad.empty:
        return "<h2>Failures</h2><p>None: every trial ran.</p>"
    rows = []
    for _, r in bad.iterrows():
        lines = r["error"].strip().splitlines() if isinstance(r["error"], str) else []  # null reads as NaN
        rows.append(
            f"<tr><td>{r['trial_number']}</td><td class=status-{html.escape(str(r['status']))}>"
            f"{html.escape(str(r['status']))}</td><td>{html.escape(short_layout(r, knobs))}</td>"
            f"<td><code>{html.escape(lines[0][:300] if lines else '(no error recorded)')}</code></td></tr>"
        )
    counts = ", ".join(f"{k} {v}" for k, v in Counter(bad["status"]).most_common())
    return (
        f"<h2>Failures ({len(bad)}: {html.escape(counts)})</h2><table class=failures><tr><th>trial</th>"
        "<th>status</th><th>layout</th><th>first error line</th></tr>" + "".join(rows) + "</table>"
    )


def _num(v: Any, digits: int) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}g}"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
.meta, .caption {{ color: #555; font-size: 0.9em; }}
.summary li {{ margin: 0.3em 0; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
img {{ max-width: 100%; border: 1px solid #eee; }}
.why li {{ margin: 0.4em 0; }}
.heat {{ display: flex; flex-wrap: wrap; gap: 8px; }}
.heat img {{ max-width: calc(50% - 8px); }}
.failures code {{ font-size: 0.95em; color: #7a1010; }}
td.status-oom, td.status-failed, td.status-timeout, td.status-kernel_unavailable {{ font-weight: bold; }}
</style></head>
<body>
{body}
</body></html>
"""
