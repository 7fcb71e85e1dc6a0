"""`sweep report`: a self-contained HTML page and PNG plots from a sweep's results and its plan.

`data` computes what the report shows (frames, arrays, dataclasses; no matplotlib), `explain`
the throughput model's analysis of the top layouts, `plots` draws the PNGs with matplotlib and
`page` writes the HTML; the names below are the package's public ones.

May import: foundation, profiles, spec, layouts, estimate, trainers, plan, results, search.
"""

from sweeper.report.data import (
    Plot,
    cell_kinds,
    gpu_hours,
    layout_text,
    match_plan_rows,
    short_layout,
    summary_lines,
    varying_knobs,
)
from sweeper.report.explain import TOP_EXPLAINED, Explained, explain_top, order_sentence, runner_up_sentences
from sweeper.report.page import render_html, write_report
from sweeper.report.plots import (
    EMPTY_FILLS,
    STATUS_COLORS,
    plot_breakdown,
    plot_heatmaps,
    plot_memory,
    plot_mfu_pred,
    plot_mfu_vs_mbs,
    plot_progress,
    plot_status,
    text_color,
)

__all__ = [
    "EMPTY_FILLS",
    "STATUS_COLORS",
    "TOP_EXPLAINED",
    "Explained",
    "Plot",
    "cell_kinds",
    "explain_top",
    "gpu_hours",
    "layout_text",
    "match_plan_rows",
    "order_sentence",
    "plot_breakdown",
    "plot_heatmaps",
    "plot_memory",
    "plot_mfu_pred",
    "plot_mfu_vs_mbs",
    "plot_progress",
    "plot_status",
    "render_html",
    "runner_up_sentences",
    "short_layout",
    "summary_lines",
    "text_color",
    "varying_knobs",
    "write_report",
]
