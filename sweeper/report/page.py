"""The report's HTML renderer and `write_report`, which draws the plots and writes the page.

The page opens offline: every plot is a PNG beside it and is also embedded as a base64 data URI;
there is no script and no stylesheet from anywhere.
"""

from __future__ import annotations

import base64
import html
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.files import atomic_write_text
from sweeper.knobs import label
from sweeper.plan.plan import Plan
from sweeper.report.data import Plot, fmt_value, match_plan_rows, short_layout, successful, summary_lines, varying_knobs
from sweeper.report.explain import explain_top, order_sentence, runner_up_sentences
from sweeper.report.plots import (
    plot_breakdown,
    plot_heatmaps,
    plot_memory,
    plot_mfu_pred,
    plot_mfu_vs_mbs,
    plot_progress,
    plot_sizes,
    plot_status,
)
from sweeper.results.noise import INTERVAL_NAME, row_mfu_range
from sweeper.spec.hardware import GIB
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus

if TYPE_CHECKING:
    import pandas as pd

    from sweeper.plan.sizes import Winner
    from sweeper.results.answer import Answer


def write_report(
    sweep: Sweep, df: pd.DataFrame, out_dir: Path, *, plan: Plan | None = None, by: Winner | None = None
) -> tuple[Path, list[str]]:
    """Write the PNGs and report.html into out_dir; returns the HTML's path and the PNG file names.
    The winner is the sweep's answer `--by` (`sweeper.results.answer`), as `sweep best` names it."""
    from sweeper.plan.plan import make_plan
    from sweeper.results.answer import measured_answer

    plan = plan or make_plan(sweep)
    out_dir.mkdir(parents=True, exist_ok=True)
    knobs = varying_knobs(df)
    rows = df.to_dict("records")
    answer = measured_answer(rows, sweep, by)
    ranked = [int(r["trial_number"]) for r in answer.ranked] if answer.row is not None else None
    ex = explain_top(df, plan, sweep, ranked=ranked)
    why: list[Plot | str] = []
    if ex is not None:
        order = order_sentence(ex)
        why = [*([order] if order else []), plot_breakdown(ex, knobs, out_dir), *runner_up_sentences(ex, knobs, sweep)]
    elif len(df[df["status"] == TrialStatus.OK]):
        why = [
            (
                "No step-time breakdown: the results could not be matched to the plan's layouts by knob values "
                "(the sweep file changed since the run?) or no successful trial measured its step time."
            )
        ]
    plots = [
        *plot_heatmaps(df, plan, out_dir, answer.nodes if sweep.several_sizes else None),
        plot_mfu_vs_mbs(df, out_dir),
        plot_memory(df, plan, sweep, out_dir),
        plot_mfu_pred(df, plan, sweep, out_dir),
        plot_progress(df, out_dir),
        plot_status(df, plan, out_dir),
    ]
    if sweep.several_sizes:  # the answer per node count
        from sweeper.report.sizes_data import size_points

        plots.insert(0, plot_sizes(size_points(plan, df.to_dict("records")), out_dir))
    shown = [p for p in plots if p is not None]
    lines = summary_lines(sweep, plan, df, answer)
    page = render_html(sweep, lines, shown, df, out_dir, why=why, plan=plan, knobs=knobs, answer=answer, rows=rows)
    path = out_dir / "report.html"
    atomic_write_text(path, page, private=False)  # for the user to open and share, as the PNGs beside it
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
    answer: Answer | None = None,
    rows: list[dict[str, Any]] | None = None,
) -> str:
    """The page: summary, the answer per node count (over several, or with a goal), why the winner
    wins, top layouts, stopped-early trials, failures, then each plot (or its note when skipped)."""
    esc = html.escape
    knobs = varying_knobs(df) if knobs is None else knobs
    parts = [
        f"<h1>sweep report: {esc(sweep.name)}</h1>",
        f"<p class=meta>{esc(_describe(sweep))}</p>",
        "<ul class=summary>",
    ]
    parts += [f"<li>{esc(line)}</li>" for line in summary]
    parts.append("</ul>")
    if answer is not None:
        from sweeper.report.sizes_page import sizes_panel

        parts.append(sizes_panel(answer, rows if rows is not None else df.to_dict("records")))
    if why:
        parts.append("<h2>Why the winner wins</h2>")
        first = next((i for i, w in enumerate(why) if isinstance(w, Plot)), len(why))
        parts += [f"<p class=order>{esc(w)}</p>" for w in why[:first] if isinstance(w, str)]  # before the bars
        sentences = [w for w in why[first:] if isinstance(w, str)]
        for w in why:
            if isinstance(w, Plot):
                parts += _plot_html(w, out_dir)
        if sentences:
            parts.append("<ul class=why>" + "".join(f"<li>{esc(t)}</li>" for t in sentences) + "</ul>")
    parts += [_top_table(df, knobs, plan, answer=answer), _stopped_table(df, knobs), _failures_table(df, knobs)]
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
    size = _size(m.num_params) + " parameters"
    if m.is_moe:  # MFU counts the parameters a token passes through (sweeper.estimate.flops)
        size += f" ({_size(m.active_params)} active per token: MFU counts these)"
    nodes = f"{{{', '.join(map(str, sweep.node_counts))}}}" if sweep.several_sizes else str(cl.nodes)
    return (
        f"{m.name}: {size}, seq {sweep.seq_len}, global batch "
        f"{sweep.global_batch_size}, {nodes}×{cl.gpus_per_node} {cl.gpu.name}, precision {sweep.trial.precision}"
    )


def _size(n: int) -> str:
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def _top_table(
    df: pd.DataFrame, knobs: list[str], plan: Plan | None, top: int = 10, answer: Answer | None = None
) -> str:
    """The best trials: the knobs that vary, step time, tokens/s, TFLOP/s per GPU, measured and predicted
    memory. Over several node counts, the trials of the node count the answer is for, in its order."""
    ok = successful(df).sort_values(["mfu", "trial_number"], ascending=[False, True])
    where = ""
    if answer is not None and answer.several and answer.row is not None:
        place = {int(r["trial_number"]): i for i, r in enumerate(answer.ranked)}
        ok = ok[ok["trial_number"].isin(place)]
        ok = ok.iloc[ok["trial_number"].map(place).to_numpy().argsort(kind="stable")]
        where = f" at {answer.nodes} node(s) (--by {answer.by.value})"
    ok = ok.head(top)
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
        "MFU 95%",
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
            row_mfu_range(r),
            *(fmt_value(r[k]) for k in knobs),
            _num(r["step_time_mean_s"], 3),
            _num(r["tokens_per_s"], 4),
            _num(r["tflops_per_gpu"], 4),
            _num(r["peak_mem_gib"], 3),
            _num(None if tensors is None else float(tensors[i]), 3),
            _num(r["pred_mem_gib"], 3),
        ]
        body.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    note = (
        f"<p class=caption>MFU 95%: the MFU at the ends of the {INTERVAL_NAME} over the trial's measured steps "
        "(- : fewer than 2 measured steps, or a row without its spread). "
        "Only the knobs that vary among the trials are shown. Predicted tensors: the "
        "estimate without its fixed per-process overhead, the number an allocator's peak compares with"
        + ("; on CPU the measured number is RSS growth above a baseline, not an allocator peak." if cpu else ".")
        + "</p>"
    )
    return (
        f"<h2>Top layouts{html.escape(where)}</h2><table class=top><tr>"
        + "".join(f"<th>{html.escape(h)}</th>" for h in head)
        + "</tr>"
        + "".join(body)
        + "</table>"
        + note
    )


def _stopped_table(df: pd.DataFrame, knobs: list[str]) -> str:
    """The trials the search stopped early (clearly slower than the best so far): not failures, their
    steps ran and were measured. Layout, steps run, the MFU of those steps, GPU-hours saved."""
    stopped = df[df["status"] == TrialStatus.STOPPED_EARLY].sort_values("trial_number")
    if stopped.empty:
        return ""
    rows = []
    for _, r in stopped.iterrows():
        times = r["step_times_s"]
        cells = [
            str(r["trial_number"]),
            short_layout(r, knobs),
            "-" if times is None else str(len(times)),
            "-" if _missing(r["mfu"]) else f"{100 * r['mfu']:.2f}%",
            _num(r["gpu_hours_saved"], 3),
        ]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    saved = stopped["gpu_hours_saved"].fillna(0).sum()
    return (
        f"<h2>Stopped early ({len(stopped)}, {saved:.3g} GPU-hours saved)</h2><p>Stopped by the search once their "
        "first measured steps ran clearly slower than the best finished trial: not failures, and not ranked "
        "among the layouts above (their MFU is of the few steps they ran).</p><table class=stopped><tr>"
        "<th>trial</th><th>layout</th><th>steps run</th><th>MFU of its steps</th><th>GPU-hours saved</th></tr>"
        + "".join(rows)
        + "</table>"
    )


def _failures_table(df: pd.DataFrame, knobs: list[str]) -> str:
    """Every trial that failed (stopped-early ones have their own section): status, layout, and the
    first line of its error."""
    bad = df[(df["status"] != TrialStatus.OK) & (df["status"] != TrialStatus.STOPPED_EARLY)].sort_values("trial_number")
    if bad.empty:
        return "<h2>Failures</h2><p>None: no trial failed.</p>"
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


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _num(v: Any, digits: int) -> str:
    return "-" if _missing(v) else f"{v:.{digits}g}"


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
.order {{ font-weight: bold; }}
.heat {{ display: flex; flex-wrap: wrap; gap: 8px; }}
.heat img {{ max-width: calc(50% - 8px); }}
.failures code {{ font-size: 0.95em; color: #7a1010; }}
tr.answer td {{ font-weight: bold; background: #eef5ff; }}
.answer-line {{ font-weight: bold; }}
td.status-oom, td.status-failed, td.status-timeout, td.status-kernel_unavailable {{ font-weight: bold; }}
</style></head>
<body>
{body}
</body></html>
"""
