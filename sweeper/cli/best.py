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
    yaml = "yaml"
    torchtitan = "torchtitan"
    megatron = "megatron"


def best(
    spec: Annotated[str, typer.Argument(help="sweep file (path or bare name)")],
    top: Annotated[int, typer.Option("--top", "-n", help="how many layouts")] = 5,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table, json, yaml (the winner's layout), torchtitan (TOML) or megatron (flags)")] = Format.table,
    results: Annotated[Optional[Path], typer.Option("--results", help="a results folder (default: results_dir/<name> of the sweep)")] = None,
) -> None:
    from rich.markup import escape

    from sweeper.cli import abort
    from sweeper.results import best_rows

    try:
        root, store = open_results(spec, results)
        rows = store.rows()
    except SweepError as e:
        abort(escape(str(e)))
    from rich.console import Console

    for w in store.warnings:
        Console(stderr=True).print(f"[yellow]warning:[/] {escape(w)}")
    if fmt is Format.json:
        from collections import Counter

        chosen = [_jsonable(r) for r in best_rows(rows, top)]
        doc = {"name": root.name, "trials": len(rows), "statuses": dict(Counter(r["status"] for r in rows)),
               "best": chosen[0] if chosen else None, "top": chosen, "layout": _winner_layout(rows, root, spec)}
        typer.echo(json.dumps(doc, indent=2))
        return
    if fmt in (Format.yaml, Format.torchtitan, Format.megatron):
        try:
            typer.echo(_export_winner(rows, root, spec, fmt.value), nl=False)
        except SweepError as e:
            abort(escape(str(e)))
        return
    print_best(rows, top=top, title=f"{root.name}: best layouts")


def open_results(spec: str, results: Path | None) -> tuple[Path, Any]:
    """The results folder (given, or the sweep's) and its store; a user error when it has none."""
    from sweeper.results import ResultsStore
    from sweeper.spec import load_sweep

    from sweeper.identity import sweep_identity

    sweep = load_sweep(spec) if results is None else None
    root = results or sweep.results_path
    if not (root / "trials").is_dir():
        raise SweepError(f"no results under {root} (run `sweep run {spec}` first)")
    if sweep is None and (root / "sweep.yaml").is_file():
        sweep = load_sweep(root / "sweep.yaml")
    # rows of another sweep (a copied file) are skipped with a warning, never ranked
    return root, ResultsStore(root, identity=sweep_identity(sweep) if sweep is not None else None)


def _sweep_of(root: Path, spec: str) -> Any:
    """The sweep as it was run (`sweep.yaml` beside the results), else the sweep file named."""
    from sweeper.spec import load_sweep

    as_run = root / "sweep.yaml"
    return load_sweep(as_run if as_run.is_file() else spec)


def _export_winner(rows: list[dict[str, Any]], root: Path, spec: str, fmt: str) -> str:
    """The best ok trial in a trainer's format; a sweep without one is a user error."""
    from sweeper.export import EXPORTERS
    from sweeper.results import best_rows

    chosen = best_rows(rows, 1)
    if not chosen:
        raise SweepError(f"no successful trial under {root} to export ({len(rows)} trials)")
    return EXPORTERS[fmt](chosen[0], _sweep_of(root, spec))


def _winner_layout(rows: list[dict[str, Any]], root: Path, spec: str) -> Any:
    """The winner's layout record for the JSON document (null without a winner or a readable sweep)."""
    from sweeper.export import layout_record
    from sweeper.results import best_rows

    chosen = best_rows(rows, 1)
    if not chosen:
        return None
    try:
        return layout_record(chosen[0], _sweep_of(root, spec))
    except SweepError:
        return None


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}


BASE_KNOBS = ("tp", "pp", "dp", "micro_batch_size")
HEADERS = {"micro_batch_size": "mbs", "sequence_parallel": "sp", "activation_checkpointing": "ckpt",
           "attention": "attn", "pp_schedule": "schedule", "virtual_stages": "v"}


def print_best(rows: list[dict[str, Any]], *, top: int, title: str) -> None:
    """The top layouts by MFU as a table (knobs that vary among the trials), and a count of the rest."""
    from collections import Counter

    from rich.table import Table

    from sweeper.cli.render import make_console
    from sweeper.knobs import KNOBS
    from sweeper.results import best_rows

    console = make_console()
    chosen = best_rows(rows, top)
    counts = Counter(r["status"] for r in rows)
    if not chosen:
        console.print(f"{title}: no successful trial yet ({', '.join(f'{k} {v}' for k, v in counts.items()) or 'no trials'})")
        return
    varying = [k for k in KNOBS if k not in BASE_KNOBS and len({r.get(k) for r in rows}) > 1]
    table = Table(title=title, title_justify="left", header_style="bold")
    for col in ("#", "trial", "MFU", "TFLOP/s/GPU", "step s", *(HEADERS.get(k, k) for k in (*BASE_KNOBS, *varying)),
                "peak GiB", "pred GiB"):
        table.add_column(col, justify="left" if col in ("ckpt", "attn", "rmsnorm", "sharding", "schedule") else "right")
    for i, r in enumerate(chosen, 1):
        knobs = [_cell(r.get(k)) for k in (*BASE_KNOBS, *varying)]
        table.add_row(str(i), str(r["trial_number"]), f"{100 * r['mfu']:.2f}%", _num(r.get("tflops_per_gpu"), 3),
                      _num(r.get("step_time_mean_s"), 3), *knobs, _num(r.get("peak_mem_gib"), 3),
                      _num(r.get("pred_mem_gib"), 3))
    console.print(table)
    console.print(f"{len(rows)} trials: " + ", ".join(f"{k} {v}" for k, v in counts.most_common()))


def _cell(v: Any) -> str:
    return ("on" if v else "-") if isinstance(v, bool) else str(v)


def _num(v: Any, digits: int) -> str:
    return "-" if v is None else f"{v:.{digits}g}"
