"""Two sweeps side by side (e.g. before and after a software upgrade) for the layouts they share."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sweeper.errors import SweepError
from sweeper.knobs import KNOBS


def compare(
    a: Annotated[str, typer.Argument(help="first sweep (sweep file or bare name)")],
    b: Annotated[str, typer.Argument(help="second sweep (sweep file or bare name)")],
    results_a: Annotated[Optional[Path], typer.Option("--results-a", help="results folder of the first sweep")] = None,
    results_b: Annotated[Optional[Path], typer.Option("--results-b", help="results folder of the second sweep")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="the comparison as one JSON object")] = False,
) -> None:
    from rich.markup import escape

    from sweeper.cli import abort

    try:
        rows_a, rows_b = _rows(a, results_a), _rows(b, results_b)
    except SweepError as e:
        abort(escape(str(e)))
    pairs = shared_layouts(rows_a, rows_b)
    ratios = [p["ratio"] for p in pairs if p["ratio"] is not None]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    if as_json:
        typer.echo(json.dumps({"a": a, "b": b, "shared": len(pairs), "geomean_ratio": geo, "layouts": pairs}, indent=2))
        return
    _print(a, b, pairs, geo)


def _rows(spec: str, results: Path | None) -> list[dict[str, Any]]:
    from sweeper.results import ResultsStore
    from sweeper.spec import load_sweep

    root = results or load_sweep(spec).results_path
    if not (root / "trials").is_dir():
        raise SweepError(f"no results under {root} (run `sweep run {spec}` first, or give --results-a/-b)")
    return ResultsStore(root).rows()


def shared_layouts(rows_a: list[dict[str, Any]], rows_b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Layouts present in both (matched on every knob), with MFU of each and B/A, best ratio first."""
    def key(r: dict[str, Any]) -> tuple:
        return tuple(r.get(k) for k in KNOBS)

    b_by = {key(r): r for r in rows_b}
    out = []
    for ra in rows_a:
        rb = b_by.get(key(ra))
        if rb is None:
            continue
        ma, mb = ra.get("mfu"), rb.get("mfu")
        ratio = mb / ma if (ma and mb and ra["status"] == rb["status"] == "ok") else None
        out.append({**{k: ra.get(k) for k in KNOBS}, "status_a": ra["status"], "status_b": rb["status"],
                    "mfu_a": ma, "mfu_b": mb, "ratio": ratio})
    return sorted(out, key=lambda p: (p["ratio"] is None, -(p["ratio"] or 0)))


def _print(a: str, b: str, pairs: list[dict[str, Any]], geo: float | None) -> None:
    from rich.table import Table

    from sweeper.cli.progress import describe
    from sweeper.cli.render import make_console

    console = make_console()
    table = Table(title=f"{a} vs {b}: layouts in both", title_justify="left", header_style="bold")
    for col in ("layout", "status A", "MFU A", "status B", "MFU B", "B/A"):
        table.add_column(col, justify="left" if col == "layout" else "right")
    for p in pairs:
        table.add_row(describe(p), p["status_a"], _pct(p["mfu_a"]), p["status_b"], _pct(p["mfu_b"]),
                      f"{p['ratio']:.3f}" if p["ratio"] is not None else "-")
    console.print(table)
    console.print(f"{len(pairs)} layouts in both; geometric mean of MFU B/A: "
                  + (f"{geo:.3f}" if geo is not None else "- (no layout ran ok in both)"))


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"
