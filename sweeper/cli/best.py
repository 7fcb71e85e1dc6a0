"""The winning layouts of a sweep, read from its results folder alone."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sweeper.errors import NoSuccessError, SweepError
from sweeper.plan.sizes import Winner

if TYPE_CHECKING:
    from sweeper.results.answer import Answer


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
    answer = _answer(rows, root, spec, by)  # None: no readable sweep file, ranked by MFU as before
    ranked = answer.ranked if answer is not None else best_rows(rows, len(rows))
    from sweeper.cli.render import winner_margin

    verdict = answer.margin() if answer is not None else winner_margin(rows)
    view = None if answer is None or answer.found is None else _view(answer)
    if fmt is Format.json:
        from collections import Counter

        chosen = [_jsonable(r) for r in ranked[:top]]
        doc = {
            "name": root.name,
            "trials": len(rows),
            "statuses": dict(Counter(r["status"] for r in rows)),
            "best": chosen[0] if chosen else None,
            "top": chosen,
            "layout": _winner_layout(ranked, answer),
            # the winner against the runner-up (of its node count): win, tie (within noise) or unknown, and its line
            "margin": None if verdict is None else {**asdict(verdict), "sentence": verdict.sentence()},
        }
        if view is not None and answer is not None:
            from sweeper.cli.best_sizes import view_json

            doc["per_nodes"] = view_json(view, by)
            row = answer.row
            doc["answer"] = {
                "by": by.value,
                "nodes": answer.nodes,
                "trial": None if row is None else row["trial_number"],
            }
        typer.echo(json.dumps(doc, indent=2))
    elif fmt in (Format.yaml, Format.torchtitan, Format.torchtitan_cli, Format.megatron, Format.nanotron):
        typer.echo(_export_winner(rows, root, spec, fmt.value, answer, view), nl=False)
        if verdict is not None and verdict.within_noise():  # the export is one of two, said beside it
            say(err, "note", verdict.sentence())
    else:
        from sweeper.cli.render import print_best

        if view is not None and answer is not None:
            from sweeper.cli.best_sizes import print_view

            print_view(view, answer)
        print_best(rows, top=top, title=f"{root.name}: best layouts", answer=answer)
    if not best_rows(rows, 1):  # the same exit status whatever the format
        raise NoSuccessError(f"no successful trial under {root} ({len(rows)} trials)")


def _answer(rows: list[dict[str, Any]], root: Path, spec: str, by: Winner) -> Answer | None:
    """The sweep's measured answer `--by` (`sweeper.results.answer`); None without a readable sweep file."""
    from sweeper.results.answer import measured_answer
    from sweeper.results.rows import sweep_as_run

    try:
        sweep = sweep_as_run(root, spec)
    except SweepError:
        return None
    return measured_answer(rows, sweep, by)


def _view(answer: Answer) -> Any:
    from sweeper.cli.best_sizes import SizeView

    assert answer.found is not None and answer.marks is not None
    return SizeView(answer.sweep, answer.found, answer.marks)


def _export_winner(
    rows: list[dict[str, Any]], root: Path, spec: str, fmt: str, answer: Answer | None, view: Any
) -> str:
    """The winning trial in a trainer's format, written for the node count it answers for; a sweep
    without one (no ok trial, or no measured size meeting the goal's limits) is a user error."""
    from sweeper.results.rows import best_rows, sweep_as_run
    from sweeper.trainers import EXPORTERS

    if not best_rows(rows, 1):
        raise NoSuccessError(f"no successful trial under {root} to export ({len(rows)} trials)")
    if answer is None:
        return EXPORTERS[fmt](best_rows(rows, 1)[0], sweep_as_run(root, spec))
    if answer.row is None:
        missed = [f"{a.nodes}: {'; '.join(a.misses)}" for a in view.found if a.misses] if view is not None else []
        why = f" (limits missed: {', '.join(missed)})" if missed else ""
        raise NoSuccessError(f"no measured node count meets the goal{why}")
    return EXPORTERS[fmt](answer.row, answer.sweep)


def _winner_layout(ranked: list[Mapping[str, Any]], answer: Answer | None) -> Any:
    """The winner's layout record for the JSON document, at its own node count (null without a
    winner or a readable sweep)."""
    from sweeper.trainers.export import layout_record

    if answer is None or answer.row is None or not ranked:
        return None
    return layout_record(answer.row, answer.sweep)


def _jsonable(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
