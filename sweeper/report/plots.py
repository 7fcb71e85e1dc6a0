"""The report's matplotlib renderer: each function draws one PNG from the records of `data` and
`explain` and returns its `Plot`. matplotlib is imported only when drawing (the Agg backend)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.files import atomic_write
from sweeper.plan.plan import Plan
from sweeper.report.data import (
    Plot,
    cell_kinds,
    colour_scale,
    gpu_hours,
    layout_counts,
    memory_points,
    mfu_points,
    short_layout,
    successful,
)
from sweeper.report.explain import Explained, bar_segments
from sweeper.report.sizes_data import SizePoints
from sweeper.spec.sweep import Sweep
from sweeper.statuses import PlanStatus, TrialStatus

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


# ---- plots ------------------------------------------------------------------------------
def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, out_dir: Path, name: str) -> str:
    """Written like every file of the tool (temp file, rename): a link planted at the name is
    replaced, never written through, and a reader never sees half a PNG."""
    try:
        atomic_write(
            out_dir / name, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"), private=False
        )
    finally:
        _pyplot().close(fig)
    return name


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


def plot_heatmaps(df: pd.DataFrame, plan: Plan, out_dir: Path, nodes: int | None = None) -> list[Plot]:
    """The paper's tp x pp view: best MFU per cell, one heatmap per attention kernel x checkpointing mode
    that has trials; cells without a measurement say why (not run, pruned, invalid, OOM, failed).
    `nodes`: a sweep over several node counts shows the answer's size alone (a cell's best over all
    sizes would set a 4-node trial beside a 32-node one, and name neither)."""
    plt = _pyplot()
    from matplotlib.colors import to_rgb
    from matplotlib.patches import Rectangle

    plots = []
    lo, hi = colour_scale(df)  # one colour scale for every heatmap, so colours compare across them
    at = "" if nodes is None else f", at {nodes} node(s)"
    shown = df if nodes is None else df[df["nodes"] == nodes]
    for (attn, ckpt), _ in shown.groupby(["attention", "activation_checkpointing"], sort=True):
        cells = cell_kinds(df, plan, str(attn), str(ckpt), nodes)
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
        ax.set_title(f"attention={attn}, checkpointing={ckpt}{at}", fontsize=10)
        name = _save(fig, out_dir, f"heatmap_{attn}_{ckpt}.png")
        plots.append(
            Plot(
                name,
                f"MFU by tp × pp — attention {attn}, checkpointing {ckpt}{at}",
                "best MFU (%) over the other knobs in each cell, one colour scale for all; a cell without one says why: "
                "not run (a candidate the search left), pruned (predicted over memory), invalid "
                "(hatched: no valid layout), or the status every trial there ended with",
            )
        )
    return plots


def plot_mfu_vs_mbs(df: pd.DataFrame, out_dir: Path) -> Plot | None:
    """The paper's micro-batch view: best MFU against micro-batch size, one line per attention kernel,
    one panel per checkpointing mode."""
    ok = successful(df)
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
    """Measured allocator peak against the estimate's tensor terms (`data.memory_points`)."""
    title = "Memory: measured allocated peak against the estimate's tensors"
    pts = memory_points(df, plan, sweep)
    if pts.skipped or pts.tensors_gib is None or pts.measured_gib is None or pts.trials is None:
        return Plot("", title, pts.skipped)
    tensors, measured = pts.tensors_gib, pts.measured_gib
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 5.0))
    ax.scatter(tensors, measured, color="tab:blue")
    for x, y, t in zip(tensors, measured, pts.trials):
        ax.annotate(str(t), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    top = max(float(tensors.max()), float(measured.max())) * 1.1
    ax.plot([0, top], [0, top], color="gray", linestyle=":", label="measured = estimate")
    if pts.budget_gib < 3 * top:
        ax.axhline(
            pts.budget_gib, color="tab:red", linestyle="--", label=f"usable for tensors {pts.budget_gib:.1f} GiB"
        )
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
    """The dry run's predicted MFU (estimate.step_time) against the measured one (`data.mfu_points`)."""
    title = "Predicted against measured MFU"
    pts = mfu_points(df, plan, sweep)
    if pts.skipped or pts.predicted is None or pts.measured is None or pts.trials is None:
        return Plot("", title, pts.skipped)
    predicted, measured = pts.predicted, pts.measured
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 5.0))
    ax.scatter(100 * predicted, 100 * measured, color="tab:blue")
    if pts.low is not None and pts.high is not None:  # each trial's 95 % interval, as every table shows it
        err = 100 * np.vstack([measured - pts.low, pts.high - measured])
        ax.errorbar(100 * predicted, 100 * measured, yerr=err, fmt="none", ecolor="tab:blue", alpha=0.5)
    for p, m, t in zip(predicted, measured, pts.trials):
        ax.annotate(str(t), (100 * p, 100 * m), fontsize=7, xytext=(3, 3), textcoords="offset points")
    top = 100 * max(predicted.max(), measured.max()) * 1.1
    ax.plot([0, top], [0, top], color="gray", linestyle=":", label="measured = predicted")
    ax.set_xlabel("predicted MFU % (dry run, uncalibrated)")
    ax.set_ylabel("measured MFU %")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    rho = pts.rank_correlation
    caption = "labels are trial numbers; bars: each trial's 95 % interval of its MFU" + (
        f"; Spearman rank correlation {rho:.2f}" if rho is not None else ""
    )
    return Plot(_save(fig, out_dir, "mfu_pred_vs_measured.png"), title, caption)


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
    layouts = layout_counts(df, plan)
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


# every part of the step-time breakdown (sweeper.estimate.step_time.PARTS) its own colour, the same
# in every plot: tab20's strong tones for the parts on the step's path, and for a hidden part the
# light tone of its exposed part's hue (dp, cp), drawn hatched besides; tests/report/test_palette.py
# fails when a part has none, or two parts share one or come within sight of each other
PART_COLORS = {
    "matmul": "#1f77b4",
    "expert_matmul": "#98df8a",
    "attention": "#9467bd",
    "memory_bound": "#8c564b",
    "framework": "#7f7f7f",
    "recompute": "#bcbd22",
    "bubble": "#ffd92f",
    "optimizer": "#17becf",
    "tp_comm": "#d62728",
    "cp_comm": "#ff7f0e",
    "ep_comm": "#e377c2",
    "pp_comm": "#2ca02c",
    "dp_comm": "#393b79",
    "dp_hidden": "#9c9ede",
    "cp_hidden": "#ffbb78",
}


def plot_breakdown(ex: Explained, knobs: list[str], out_dir: Path) -> Plot:
    """Per top layout: the model's stacked step time (its exposed parts, so the bar is as long as the
    modelled step), hidden DP and cp-ring traffic as a thin hatched strip under the bar's end (it
    overlaps backward, so it adds nothing to the step), and below them the measured step time."""
    from sweeper.estimate.step_time import HIDDEN_PARTS, PART_LABELS, PARTS

    plt = _pyplot()
    n = len(ex.trials)
    fig, ax = plt.subplots(figsize=(10.5, 1.2 + 1.05 * n))
    colors = PART_COLORS
    segments = bar_segments(ex)
    labels = []
    for i, (_, r) in enumerate(ex.trials.iterrows()):
        y = 2.6 * i
        for seg in (g for g in segments if g.row == i):
            if seg.hidden:  # a thin strip under the bar's end: inside the step, never past it
                ax.barh(y + 0.5, seg.width_s, left=seg.left_s, height=0.2, color=colors[seg.part], hatch="//")
            else:
                ax.barh(y, seg.width_s, left=seg.left_s, color=colors[seg.part], edgecolor="white", linewidth=0.5)
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
        [Patch(facecolor=colors[k], hatch="//" if k in HIDDEN_PARTS else None) for k in used],
        [PART_LABELS[k] for k in used],
        fontsize=8,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
    )
    ax.set_xlim(0, max(float(ex.predicted_s.max()), float(ex.trials["step_time_mean_s"].max())) * 1.25)
    ax.grid(axis="x", alpha=0.3)
    return Plot(
        _save(fig, out_dir, "step_breakdown.png"),
        "Why the winner wins: step-time breakdown",
        "upper bar of each pair: the throughput model (sweeper/estimate/step_time.py) split into its parts, "
        "calibrated to the measured step times of every successful trial, all on one scale: its length is the "
        "modelled step; thin hatched strip: data-parallel traffic hidden behind backward (inside the step, not "
        "on its path). Lower, dark bar: the measured mean step time (for a row with only an MFU, the step time "
        "that MFU implies).",
    )


def plot_sizes(points: SizePoints, out_dir: Path) -> Plot:
    """Days against cost per node count (measured filled, predicted hollow with its band), the goal's
    max_days and max_cost as lines, and each size's scaling efficiency against the smallest."""
    title = "Node counts: days against cost, and scaling efficiency"
    if not points.points:
        return Plot("", title, "no node count has a runnable layout")
    fig = draw_sizes(points)
    caption = "filled/blue: the best measured trial of the size; hollow/orange: the best predicted layout"
    limits = [f"{name} {v:g}" for name, v in (("max_days", points.max_days), ("max_cost", points.max_cost)) if v]
    caption += f"; dashed red: the goal's {' and '.join(limits)}" if limits else ""
    return Plot(_save(fig, out_dir, "nodes_cost.png"), title, caption)


def draw_sizes(points: SizePoints) -> Figure:
    """The figure of `plot_sizes`, every label inside its axes (the axes widened to hold them)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.0, 4.5))
    for p in points.points:
        style = {"color": "tab:blue"} if p.measured else {"facecolors": "none", "edgecolors": "tab:orange"}
        left.scatter([p.cost], [p.days], s=60, **style)
        if not p.measured and p.band:  # a prediction's band moves days and cost together
            left.errorbar(
                [p.cost], [p.days], xerr=[[p.cost * p.band]], yerr=[[p.days * p.band]], color="tab:orange", alpha=0.5
            )
        left.annotate(f"{p.nodes} nodes", (p.cost, p.days), fontsize=8, xytext=(4, 4), textcoords="offset points")
    if points.max_days is not None:
        left.axhline(
            points.max_days, color="tab:red", linestyle="--", linewidth=1, label=f"max_days {points.max_days:g}"
        )
    if points.max_cost is not None:
        left.axvline(
            points.max_cost, color="tab:red", linestyle="-.", linewidth=1, label=f"max_cost {points.max_cost:g}"
        )
    left.scatter([], [], color="tab:blue", label="measured")
    left.scatter([], [], facecolors="none", edgecolors="tab:orange", label="predicted (± band)")
    left.set_xlabel(points.cost_label)
    left.set_ylabel(points.days_label)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    nodes = [p.nodes for p in points.points]
    colors = ["tab:blue" if p.measured else "tab:orange" for p in points.points]
    right.bar([str(n) for n in nodes], [100 * p.efficiency for p in points.points], color=colors)
    right.axhline(100, color="gray", linestyle=":")
    right.set_xlabel("nodes")
    right.set_ylabel(f"scaling efficiency % (tokens/s per GPU against {nodes[0]} nodes)")
    right.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    _hold_labels(fig, left)
    return fig


def _hold_labels(fig: Figure, ax: Any) -> None:
    """Widen `ax`'s limits until every annotation (a node count's label) lies inside it: a label past
    the edge is cut at the axes or runs into the next panel."""
    fig.canvas.draw()
    for _ in range(8):
        box = ax.get_window_extent()
        out = [t.get_window_extent() for t in ax.texts]
        over_x = max((b.x1 - box.x1 for b in out), default=0.0)
        over_y = max((b.y1 - box.y1 for b in out), default=0.0)
        if over_x <= 0 and over_y <= 0:
            return
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        if over_x > 0:
            ax.set_xlim(x0, x1 + (x1 - x0) * (over_x + 4) / box.width)
        if over_y > 0:
            ax.set_ylim(y0, y1 + (y1 - y0) * (over_y + 4) / box.height)
        fig.canvas.draw()
