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

from sweeper.knobs import KNOBS, label
from sweeper.layout import RULE_SUMMARIES
from sweeper.plan import CANDIDATE, Plan
from sweeper.spec import Sweep
from sweeper.statuses import PlanReason, PlanStatus, TrialStatus

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

STATUS_COLORS = {TrialStatus.OK: "tab:green", TrialStatus.OOM: "tab:red", TrialStatus.TIMEOUT: "tab:orange",
                 TrialStatus.FAILED: "black", TrialStatus.KERNEL_UNAVAILABLE: "tab:purple"}


@dataclass(frozen=True)
class Plot:
    """One PNG of the report: its file name, a heading, and a caption (why it is there or why empty)."""

    file: str
    title: str
    caption: str = ""


def layout_text(row: Any) -> str:
    """A layout in one line: tp, pp, dp, mbs, grad_accum, then every other knob (`knob=value`)."""
    base = [f"tp={row['tp']}", f"pp={row['pp']}", f"dp={row['dp']}", f"mbs={row['micro_batch_size']}",
            f"grad_accum={row['grad_accum']}"]
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
    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()].sort_values(["mfu", "trial_number"], ascending=[False, True])
    lines = []
    if len(ok):
        w = ok.iloc[0]
        lines.append(f"Winner: trial {w['trial_number']} at {100 * w['mfu']:.2f}% MFU — {layout_text(w)}")
        if len(ok) > 1:
            r = ok.iloc[1]
            lines.append(f"Margin over the runner-up (trial {r['trial_number']}, {100 * r['mfu']:.2f}% MFU): "
                         f"{100 * (w['mfu'] - r['mfu']):.2f} points, {100 * (w['mfu'] / r['mfu'] - 1):.1f}% faster; "
                         f"runner-up: {layout_text(r)}")
        else:
            lines.append("No runner-up: only one trial succeeded.")
    else:
        lines.append("No successful trial yet.")
    counts = plan.counts()
    cands = counts.get(CANDIDATE, 0)
    share = f" ({100 * len(df) / cands:.0f}%)" if cands else ""
    statuses = ", ".join(f"{k} {v}" for k, v in Counter(df["status"]).most_common())
    lines.append(f"Grid run: {len(df)} trials of {cands} candidate layouts{share}; "
                 f"{len(plan)} layouts in the cross product. Trials: {statuses or 'none'}.")
    reasons = plan.reason_counts()
    pruned = counts.get(PlanStatus.PRUNED, 0)
    lines.append(f"Pruned by the memory estimate: {pruned}" + (
        f" (over {100 * (1 - sweep.memory.headroom):.0f}% of {sweep.cluster.gpu.memory_gib:g} GiB)." if pruned else "."))
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


def plot_heatmaps(df: pd.DataFrame, out_dir: Path) -> list[Plot]:
    """Best MFU per (tp, pp) cell, one heatmap per attention kernel x checkpointing mode with data."""
    plt = _pyplot()
    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()]
    plots = []
    for (attn, ckpt), part in ok.groupby(["attention", "activation_checkpointing"], sort=True):
        grid = part.pivot_table(index="tp", columns="pp", values="mfu", aggfunc="max").sort_index().sort_index(axis=1)
        fig, ax = plt.subplots(figsize=(1.4 + 1.2 * grid.shape[1], 1.2 + 0.9 * grid.shape[0]))
        im = ax.imshow(100 * grid.to_numpy(float), cmap="viridis", origin="lower", aspect="auto")
        ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
        ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index])
        ax.set_xlabel("pp")
        ax.set_ylabel("tp")
        for (i, j), v in np.ndenumerate(grid.to_numpy(float)):
            ax.text(j, i, "-" if math.isnan(v) else f"{100 * v:.1f}", ha="center", va="center",
                    color="gray" if math.isnan(v) else "white")
        fig.colorbar(im, ax=ax, label="MFU %")
        ax.set_title(f"attention={attn}, ckpt={ckpt}")
        name = _save(fig, out_dir, f"heatmap_{attn}_{ckpt}.png")
        plots.append(Plot(name, f"MFU by tp × pp — attention {attn}, checkpointing {ckpt}",
                          "best MFU (%) over the other knobs in each cell; '-' not run or not ok"))
    return plots


def plot_mfu_vs_mbs(df: pd.DataFrame, out_dir: Path) -> Plot | None:
    """Best MFU against micro-batch size, one line per (tp, pp)."""
    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()]
    if ok.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for (tp, pp), part in ok.groupby(["tp", "pp"]):
        best = part.groupby("micro_batch_size")["mfu"].max()
        ax.plot(best.index, 100 * best.to_numpy(float), marker="o", label=f"tp={tp} pp={pp}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(ok["micro_batch_size"].unique()), [str(m) for m in sorted(ok["micro_batch_size"].unique())])
    ax.set_xlabel("micro-batch size")
    ax.set_ylabel("best MFU %")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return Plot(_save(fig, out_dir, "mfu_vs_mbs.png"), "MFU against micro-batch size",
                "best MFU over the other knobs, one line per tp × pp")


def plot_memory(df: pd.DataFrame, sweep: Sweep, out_dir: Path) -> Plot | None:
    """Predicted against measured peak memory per GPU, with the card's limit and the usable share drawn."""
    rows = df[df["pred_mem_gib"].notna() & df["peak_mem_gib"].notna()]
    if rows.empty:
        return None
    plt = _pyplot()
    gpu = sweep.cluster.gpu
    cpu = (df["device"] == "cpu").any() or gpu.name == "cpu"
    fig, ax = plt.subplots(figsize=(6.0, 5.0))
    for status, part in rows.groupby("status"):
        ax.scatter(part["pred_mem_gib"], part["peak_mem_gib"], label=status, color=STATUS_COLORS.get(status, "gray"))
    top = max(rows["pred_mem_gib"].max(), rows["peak_mem_gib"].max()) * 1.1
    ax.plot([1e-3, top], [1e-3, top], color="gray", linestyle=":", label="measured = predicted")
    usable = gpu.memory_gib * (1 - sweep.memory.headroom)
    ax.axvline(gpu.memory_gib, color="tab:red", label=f"card {gpu.memory_gib:g} GiB")
    ax.axhline(gpu.memory_gib, color="tab:red")
    ax.axvline(usable, color="tab:red", linestyle="--", label=f"usable {usable:.1f} GiB")
    if gpu.memory_gib > 3 * top:  # log axes keep the card's line and the points both readable
        ax.set_xscale("log")
        ax.set_yscale("symlog", linthresh=0.01)
        ax.set_ylim(0, gpu.memory_gib * 1.5)
        ax.plot([top, gpu.memory_gib * 1.5], [top, gpu.memory_gib * 1.5], color="gray", linestyle=":")
    ax.set_xlabel("predicted peak GiB per device")
    ax.set_ylabel("measured peak GiB per device")
    note = f"card limit {gpu.memory_gib:g} GiB ({gpu.name})"
    if cpu:
        note = f"CPU: measured = RSS growth above a baseline, not allocator peak; {note}"
        ax.set_title("on CPU, measured is RSS growth above a baseline", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return Plot(_save(fig, out_dir, "memory_pred_vs_measured.png"), "Predicted against measured peak memory", note)


def plot_mfu_pred(df: pd.DataFrame, plan: Plan, sweep: Sweep, out_dir: Path) -> Plot:
    """The dry run's predicted MFU (perfmodel) against the measured one, matched to plan rows by knobs."""
    from sweeper.perfmodel import predict

    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()]
    idx = match_plan_rows(plan, ok) if len(ok) else None
    title = "Predicted against measured MFU"
    if idx is None:
        return Plot("", title, "skipped: results could not be matched to the plan's layouts by knob values "
                    "(the sweep file changed since the run?)" if len(ok) else "skipped: no successful trial")
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
    best = np.maximum.accumulate(100 * ordered["mfu"].where(ordered["status"] == TrialStatus.OK).fillna(0.0).to_numpy(float))
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
    """Trials by status, beside the plan's layouts by status (candidates run / not run, pruned, invalid)."""
    plt = _pyplot()
    trials = Counter(df["status"])
    counts = plan.counts()
    cands = counts.get(CANDIDATE, 0)
    layouts = {"candidate, run": min(len(df), cands), "candidate, not run": max(cands - len(df), 0),
               "pruned (memory)": counts.get(PlanStatus.PRUNED, 0), PlanStatus.INVALID: counts.get(PlanStatus.INVALID, 0)}
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    names = list(trials) or ["none"]
    a1.bar(names, [trials.get(n, 0) for n in names], color=[STATUS_COLORS.get(n, "gray") for n in names])
    a1.set_title("trials by status")
    a2.barh(list(layouts), list(layouts.values()), color=["tab:green", "tab:olive", "tab:red", "gray"])
    a2.set_title("layouts of the plan")
    a2.set_xscale("symlog")
    for ax, vals in ((a1, [trials.get(n, 0) for n in names]), (a2, list(layouts.values()))):
        for i, v in enumerate(vals):
            if ax is a1:
                ax.text(i, v, str(v), ha="center", va="bottom")
            else:
                ax.text(v, i, f" {v}", va="center")
    return Plot(_save(fig, out_dir, "status.png"), "Status breakdown", "")


# ---- the page ---------------------------------------------------------------------------
def write_report(sweep: Sweep, df: pd.DataFrame, out_dir: Path, *, plan: Plan | None = None) -> tuple[Path, list[str]]:
    """Write the PNGs and report.html into out_dir; returns the HTML's path and the PNG file names."""
    from sweeper.plan import make_plan

    plan = plan or make_plan(sweep)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [*plot_heatmaps(df, out_dir), plot_mfu_vs_mbs(df, out_dir), plot_memory(df, sweep, out_dir),
             plot_mfu_pred(df, plan, sweep, out_dir), plot_progress(df, out_dir), plot_status(df, plan, out_dir)]
    page = render_html(sweep, summary_lines(sweep, plan, df), [p for p in plots if p is not None], df, out_dir)
    path = out_dir / "report.html"
    tmp = path.with_name(".report.html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path, [p.file for p in plots if p is not None and p.file]


def render_html(sweep: Sweep, summary: list[str], plots: list[Plot], df: pd.DataFrame, out_dir: Path) -> str:
    """The page: summary, top trials, then each plot as an embedded PNG (or its note when skipped)."""
    esc = html.escape
    parts = [f"<h1>sweep report: {esc(sweep.name)}</h1>",
             f"<p class=meta>{esc(_describe(sweep))}</p>", "<ul class=summary>"]
    parts += [f"<li>{esc(line)}</li>" for line in summary]
    parts += ["</ul>", _top_table(df)]
    for p in plots:
        parts.append(f"<h2>{esc(p.title)}</h2>")
        if p.file:
            data = base64.b64encode((out_dir / p.file).read_bytes()).decode("ascii")
            parts.append(f'<img alt="{esc(p.title)}" src="data:image/png;base64,{data}">')
        if p.caption:
            parts.append(f"<p class=caption>{esc(p.caption)}" + (f" (file: {esc(p.file)})" if p.file else "") + "</p>")
    return _PAGE.format(title=esc(f"sweep report: {sweep.name}"), body="\n".join(parts))


def _describe(sweep: Sweep) -> str:
    m, cl = sweep.model, sweep.cluster
    size = f"{m.num_params / 1e9:.3g}B" if m.num_params >= 1e9 else f"{m.num_params / 1e6:.3g}M"
    return (f"{m.name}: {size} parameters, seq {sweep.seq_len}, global batch "
            f"{sweep.global_batch_size}, {cl.nodes}×{cl.gpus_per_node} {cl.gpu.name}, precision {sweep.trial.precision}")


def _top_table(df: pd.DataFrame, top: int = 10) -> str:
    ok = df[(df["status"] == TrialStatus.OK) & df["mfu"].notna()].sort_values(["mfu", "trial_number"], ascending=[False, True])
    if ok.empty:
        return ""
    rows = "".join(
        f"<tr><td>{i}</td><td>{r['trial_number']}</td><td>{100 * r['mfu']:.2f}%</td>"
        f"<td>{html.escape(layout_text(r))}</td></tr>" for i, (_, r) in enumerate(ok.head(top).iterrows(), 1))
    return ("<h2>Top layouts</h2><table><tr><th>#</th><th>trial</th><th>MFU</th><th>layout</th></tr>"
            f"{rows}</table>")


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; max-width: 1100px; margin: 2em auto; color: #222; }}
.meta, .caption {{ color: #555; font-size: 0.9em; }}
.summary li {{ margin: 0.3em 0; }}
table {{ border-collapse: collapse; font-size: 0.9em; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
img {{ max-width: 100%; border: 1px solid #eee; }}
</style></head>
<body>
{body}
</body></html>
"""
