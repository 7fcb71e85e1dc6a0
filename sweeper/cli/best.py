"""The winning layouts of a sweep, read from its results folder alone."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from sweeper.errors import SweepError


class Format(str, Enum):
    table = "table"
    json = "json"


def best(
    spec: Annotated[str, typer.Argument(help="sweep file (path or bare name)")],
    top: Annotated[int, typer.Option("--top", "-n", help="how many layouts")] = 5,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table or json")] = Format.table,
    results: Annotated[Optional[Path], typer.Option("--results", help="a results folder (default: results_dir/<name> of the sweep)")] = None,
) -> None:
    from rich.markup import escape

    from sweeper.cli import abort
    from sweeper.results import ResultsStore, best_rows

    try:
        root = results or _results_root(spec)
        if not (root / "trials").is_dir():
            raise SweepError(f"no results under {root} (run `sweep run {spec}` first)")
        store = ResultsStore(root)
        rows = store.rows()
    except SweepError as e:
        abort(escape(str(e)))
    from rich.console import Console

    for w in store.warnings:
        Console(stderr=True).print(f"[yellow]warning:[/] {escape(w)}")
    if fmt is Format.json:
        chosen = best_rows(rows, top)
        typer.echo(json.dumps([_jsonable(r) for r in chosen], indent=2))
        return
    print_best(rows, top=top, title=f"{root.name}: best layouts")


def _results_root(spec: str) -> Path:
    from sweeper.spec import load_sweep

    return load_sweep(spec).results_path


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}


def print_best(rows: list[dict[str, Any]], *, top: int, title: str) -> None:
    """The top layouts by MFU as a table, and a one-line count of the rest."""
    from collections import Counter

    from rich.console import Console
    from rich.table import Table

    from sweeper.results import best_rows

    console = Console()
    chosen = best_rows(rows, top)
    counts = Counter(r["status"] for r in rows)
    if not chosen:
        console.print(f"{title}: no successful trial yet ({', '.join(f'{k} {v}' for k, v in counts.items()) or 'no trials'})")
        return
    table = Table(title=title, title_justify="left", header_style="bold")
    for col in ("#", "trial", "MFU", "TFLOP/s/GPU", "step s", "tp", "pp", "dp", "mbs", "sp", "ckpt", "attn", "rmsnorm", "peak GiB", "pred GiB"):
        table.add_column(col, justify="right" if col not in ("ckpt", "attn", "rmsnorm") else "left")
    for i, r in enumerate(chosen, 1):
        table.add_row(
            str(i), str(r["trial_number"]), f"{100 * r['mfu']:.2f}%", _num(r.get("tflops_per_gpu"), 3),
            _num(r.get("step_time_mean_s"), 3), str(r["tp"]), str(r["pp"]), str(r["dp"]), str(r["micro_batch_size"]),
            "on" if r["sequence_parallel"] else "-", r["activation_checkpointing"], r["attention"], r["rmsnorm"],
            _num(r.get("peak_mem_gib"), 2), _num(r.get("pred_mem_gib"), 2),
        )
    console.print(table)
    console.print(f"{len(rows)} trials: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))


def _num(v: Any, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}g}"
