"""Write results/<name>/report.html and its PNG plots: the winner, the grid, memory, progress, statuses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sweeper.errors import SweepError
from sweeper.plan.sizes import Winner
from sweeper.results.answer import DEFAULT_BY


def report(
    spec: Annotated[str, typer.Argument(help="sweep file (path or bare name)")],
    results: Annotated[
        Path | None, typer.Option("--results", help="a results folder (default: results_dir/<name> of the sweep)")
    ] = None,
    by: Annotated[
        Winner,
        typer.Option("--by", help="the winner over node counts: time (the fastest run) or cost (the cheapest)"),
    ] = DEFAULT_BY,
) -> None:

    from sweeper.cli.render import message_console, say
    from sweeper.report import write_report
    from sweeper.results.rows import open_results, sweep_as_run

    root, store = open_results(spec, results)
    frame = store.frame()
    if frame.empty:
        raise SweepError(f"no finished trial under {root} yet (see `sweep status {spec}`)")
    sweep = sweep_as_run(root, spec)
    err = message_console()
    for w in store.warnings:
        say(err, "warning", w)
    path, pngs = write_report(sweep, frame, root, by=by)
    typer.echo(f"{path}  ({len(pngs)} plots: {', '.join(pngs)})")
