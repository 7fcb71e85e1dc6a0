"""The winning layouts of a sweep, read from its results folder alone."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from sweeper.errors import NoSuccessError, SweepError
from sweeper.plan.sizes import Winner


class Format(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"
    torchtitan = "torchtitan"
    torchtitan_cli = "torchtitan-cli"
    megatron = "megatron"
    nanotron = "nanotron"
    deepspeed = "deepspeed"


def best(
    spec: Annotated[str, typer.Argument(help="sweep file (path or bare name)")],
    top: Annotated[int, typer.Option("--top", "-n", min=1, help="how many layouts (at least 1)")] = 5,
    fmt: Annotated[
        Format,
        typer.Option(
            "--format",
            "-f",
            help="table, json, yaml (the winner's layout), torchtitan (0.2.x TOML), torchtitan-cli (0.3.x overrides), megatron (flags), nanotron (YAML config) or deepspeed (ds_config.json)",
        ),
    ] = Format.table,
    results: Annotated[
        Path | None, typer.Option("--results", help="a results folder (default: results_dir/<name> of the sweep)")
    ] = None,
    by: Annotated[
        Winner,
        typer.Option("--by", help="the winner over node counts: time (the fastest run) or cost (the cheapest)"),
    ] = Winner.time,
    plan: Annotated[
        bool,
        typer.Option(
            "--plan",
            metavar="",
            help="the layouts the plan predicts best (the dry run's first rows), before any trial; marked predicted",
        ),
    ] = False,
) -> None:
    if plan:
        if results is not None:
            raise SweepError(
                "--plan exports the plan's prediction from the sweep file; --results reads measured ones: give one"
            )
        from sweeper.cli.best_plan import best_predicted

        best_predicted(spec, top=top, fmt=fmt.value, by=by)
        return

    from sweeper.results.rows import best_rows, open_results

    root, store = open_results(spec, results)
    rows = store.rows()

    from sweeper.cli.render import message_console, say

    err = message_console()
    for w in store.warnings:
        say(err, "warning", w)
    from sweeper.cli.render import winner_margin

    verdict = winner_margin(rows)
    from sweeper.cli.best_sizes import size_view

    view = size_view(rows, root, spec)  # None: one node count and no goal, answered as before
    if fmt is Format.json:
        from collections import Counter

        chosen = [_jsonable(r) for r in best_rows(rows, top)]
        doc = {
            "name": root.name,
            "trials": len(rows),
            "statuses": dict(Counter(r["status"] for r in rows)),
            "best": chosen[0] if chosen else None,
            "top": chosen,
            "layout": _winner_layout(rows, root, spec),
            # the winner against the runner-up: win, tie (within noise) or unknown, and the line that says it
            "margin": None if verdict is None else {**asdict(verdict), "sentence": verdict.sentence()},
        }
        if view is not None:
            from sweeper.cli.best_sizes import view_json

            doc["per_nodes"] = view_json(view, by)
        typer.echo(json.dumps(doc, indent=2))
    elif fmt in (Format.yaml, Format.torchtitan, Format.torchtitan_cli, Format.megatron, Format.nanotron):
        typer.echo(_export_winner(rows, root, spec, fmt.value, view, by), nl=False)
        if verdict is not None and verdict.within_noise():  # the export is one of two, said beside it
            say(err, "note", verdict.sentence())
    else:
        from sweeper.cli.render import print_best

        if view is not None:
            from sweeper.cli.best_sizes import print_view

            print_view(view, by)
        print_best(rows, top=top, title=f"{root.name}: best layouts")
    if not best_rows(rows, 1):  # the same exit status whatever the format
        raise NoSuccessError(f"no successful trial under {root} ({len(rows)} trials)")


def _export_winner(
    rows: list[dict[str, Any]], root: Path, spec: str, fmt: str, view: Any = None, by: Winner = Winner.time
) -> str:
    """The best ok trial in a trainer's format (over several node counts: the winner `--by`, for
    its node count); a sweep without one is a user error."""
    from sweeper.results.rows import best_rows, sweep_as_run
    from sweeper.trainers import EXPORTERS

    chosen = best_rows(rows, 1)
    if not chosen:
        raise NoSuccessError(f"no successful trial under {root} to export ({len(rows)} trials)")
    if view is not None:
        from sweeper.cli.best_sizes import winner_row

        row, sweep, _ = winner_row(rows, view, by)
        return EXPORTERS[fmt](row, sweep)
    return EXPORTERS[fmt](chosen[0], sweep_as_run(root, spec))


def _winner_layout(rows: list[dict[str, Any]], root: Path, spec: str) -> Any:
    """The winner's layout record for the JSON document (null without a winner or a readable sweep)."""
    from sweeper.results.rows import best_rows, sweep_as_run
    from sweeper.trainers.export import layout_record

    chosen = best_rows(rows, 1)
    if not chosen:
        return None
    try:
        return layout_record(chosen[0], sweep_as_run(root, spec))
    except SweepError:
        return None


def _jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
