"""Two sweeps side by side for the layouts they share: MFU of each, their ratio, and each status."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    import pandas as pd


class Format(StrEnum):
    table = "table"
    json = "json"


def compare(
    a: Annotated[str, typer.Argument(help="first sweep file (path or bare name); ignored with --results-a")],
    b: Annotated[
        str | None,
        typer.Argument(
            help="second sweep file (path or bare name); ignored with --results-b; left out: A's node counts side by side"
        ),
    ] = None,
    results_a: Annotated[Path | None, typer.Option("--results-a", help="results folder of A")] = None,
    results_b: Annotated[Path | None, typer.Option("--results-b", help="results folder of B")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table or json")] = Format.table,
) -> None:
    frame_a, name_a = _load(a, results_a, "--results-a")
    if b is None and results_b is None:  # one sweep over several node counts: each layout across its sizes
        from sweeper.cli.compare_sizes import show_across_sizes

        show_across_sizes(frame_a, name_a, as_json=fmt is Format.json)
        return
    frame_b, name_b = _load(b or "", results_b, "--results-b")
    shared = shared_layouts(frame_a, frame_b)
    summary = summarize(shared)
    if fmt is Format.json:
        doc = {
            "a": name_a,
            "b": name_b,
            **summary,
            "layouts": shared.astype(object).where(shared.notna(), None).to_dict(orient="records"),
        }
        typer.echo(json.dumps(doc, indent=2, default=_jsonable))
        return
    _print_table(shared, summary, name_a, name_b)


def _load(spec: str, results: Path | None, option: str) -> tuple[pd.DataFrame, str]:
    """A sweep's results frame and its name, from --results-a/-b (`option`) or the sweep file's results folder."""
    from sweeper.cli.render import message_console, say
    from sweeper.results.rows import open_results

    root, store = open_results(spec, results, option=option)
    frame = store.frame()
    err = message_console()
    for w in store.warnings:  # a row of another sweep, or of a node count it never ran: skipped, said
        say(err, "warning", w)
    return frame, root.name


def shared_layouts(frame_a: pd.DataFrame, frame_b: pd.DataFrame) -> pd.DataFrame:
    """Layouts run in both sweeps (matched on every knob), the latest trial of each, sorted by MFU B / MFU A."""
    from sweeper.knobs import KNOBS

    keys = list(KNOBS)
    cols = [*keys, "trial_number", "status", "mfu"]
    last_a = frame_a[cols].sort_values("trial_number").drop_duplicates(keys, keep="last")
    last_b = frame_b[cols].sort_values("trial_number").drop_duplicates(keys, keep="last")
    both = last_a.merge(last_b, on=keys, suffixes=("_a", "_b"))
    both["ratio"] = [_ratio(x, y) for x, y in zip(both["mfu_a"], both["mfu_b"])]
    return both.sort_values("ratio", ascending=False, na_position="last").reset_index(drop=True)


def _ratio(mfu_a: Any, mfu_b: Any) -> float | None:
    """MFU B / MFU A, or None where either side has no MFU (a failed trial)."""
    if mfu_a is None or mfu_b is None or math.isnan(mfu_a) or math.isnan(mfu_b) or mfu_a <= 0:
        return None
    return float(mfu_b / mfu_a)


def summarize(shared: pd.DataFrame) -> dict[str, Any]:
    """How many layouts are shared, how many have an MFU on both sides, and the geometric mean of B / A."""
    ratios = [r for r in shared["ratio"] if r is not None and not math.isnan(r)]
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None
    return {"shared": len(shared), "with_ratio": len(ratios), "geomean_ratio": geomean}


def _print_table(shared: pd.DataFrame, summary: dict[str, Any], name_a: str, name_b: str) -> None:
    from rich.table import Table

    from sweeper.cli.render import make_console
    from sweeper.knobs import KNOBS, label, shown_in_tables

    console = make_console()
    # as the other tables: a knob that does not vary, or only follows another (etp = tp, dense), is left out
    records = shared[list(KNOBS)].to_dict(orient="records")
    varying = [k for k, knob in KNOBS.items() if knob.always_shown or shown_in_tables(k, records)]
    table = Table(title=f"{name_a} (A) vs {name_b} (B): shared layouts", title_justify="left", header_style="bold")
    for col in (*(label(k) for k in varying), "MFU A", "MFU B", "B / A", "status A", "status B"):
        table.add_column(col, justify="right" if not col.startswith("status") else "left")
    for _, r in shared.iterrows():
        table.add_row(
            *(str(r[k]) for k in varying),
            _pct(r["mfu_a"]),
            _pct(r["mfu_b"]),
            "-" if r["ratio"] is None or math.isnan(r["ratio"]) else f"{r['ratio']:.3f}",
            str(r["status_a"]),
            str(r["status_b"]),
        )
    if len(shared):
        console.print(table)
    g = summary["geomean_ratio"]
    console.print(
        f"{summary['shared']} layouts shared, {summary['with_ratio']} with an MFU on both sides; "
        f"geometric mean B / A: {'-' if g is None else f'{g:.3f}'}"
    )


def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{100 * v:.2f}%"


def _jsonable(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else str(v)
