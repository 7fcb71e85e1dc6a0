"""Every trial of a sweep: queued / running / finished, with job ids and elapsed time."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from sweeper.plan.sizes import Winner
from sweeper.results.answer import DEFAULT_BY
from sweeper.statuses import TrialStatus
from sweeper.text import for_markup


def status(
    spec: Annotated[str, typer.Argument(help="sweep file (path or bare name)")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per trial")] = False,
    results: Annotated[
        Path | None, typer.Option("--results", help="a results folder (default: results_dir/<name> of the sweep)")
    ] = None,
    by: Annotated[
        Winner,
        typer.Option("--by", help="over node counts, the answer so far: time (the fastest run) or cost (the cheapest)"),
    ] = DEFAULT_BY,
) -> None:
    from rich.table import Table

    from sweeper.cli.progress import describe
    from sweeper.results.rows import open_results

    # no results folder: an error, as for `sweep best` (not "0 finished" from the wrong folder)
    root, store = open_results(spec, results)
    rows = store.rows()
    inflight = store.inflight()
    now = datetime.now(UTC)
    several = len({r.get("nodes") for r in rows} | {rec.get("nodes") for rec in inflight} - {None}) > 1
    items: list[dict[str, Any]] = []
    for r in rows:
        elapsed = (
            (r["finished_at"] - r["started_at"]).total_seconds()
            if r.get("started_at") and r.get("finished_at")
            else None
        )
        items.append(
            {
                "trial_number": r["trial_number"],
                "status": r["status"],
                "job_id": r.get("job_id"),
                "elapsed_s": elapsed,
                "layout": _sized(r.get("nodes"), describe(r), several),
                "mfu": r.get("mfu"),
                "attempt": r.get("attempt"),
            }
        )
    for rec in inflight:
        started = datetime.fromisoformat(rec["started_at"]) if rec.get("started_at") else None
        items.append(
            {
                "trial_number": rec["trial_number"],
                "status": "running",
                "job_id": rec.get("job_id"),
                "elapsed_s": (now - started).total_seconds() if started else None,
                "layout": _sized(rec.get("nodes", rec["layout"].get("nodes")), describe(rec["layout"]), several),
                "mfu": None,
                "attempt": rec.get("attempt"),
            }
        )
    items.sort(key=lambda x: x["trial_number"])
    if as_json:
        for it in items:
            typer.echo(json.dumps(it))
        return
    from sweeper.cli.render import make_console

    console = make_console()
    from sweeper.cli.render import message_console, say

    err = message_console()
    for w in store.warnings:
        say(err, "warning", w)
    table = Table(
        title=f"{root.name}: {len(rows)} finished, {len(inflight)} running", title_justify="left", header_style="bold"
    )
    for col in ("trial", "status", "job id", "elapsed", "MFU", "layout"):
        table.add_column(col)
    for it in items:
        colour = {TrialStatus.OK: "green", "running": "cyan"}.get(it["status"], "red")
        table.add_row(
            str(it["trial_number"]),
            f"[{colour}]{for_markup(it['status'])}[/]",
            for_markup(it["job_id"] or "-"),
            f"{it['elapsed_s']:.0f} s" if it["elapsed_s"] is not None else "-",
            f"{100 * it['mfu']:.2f}%" if it["mfu"] is not None else "-",
            for_markup(it["layout"]),
        )
    console.print(table)
    from sweeper.cli.render import print_float8_note

    print_float8_note(console, [r.get("float8") for r in rows if r.get("mfu") is not None], "MFU")
    _print_answer(console, rows, root, spec, by)


def _sized(nodes: Any, layout: str, several: bool) -> str:
    """A trial's layout, its node count first where the sweep ran at several."""
    return f"nodes={nodes} {layout}" if several and nodes is not None else layout


def _print_answer(console: Any, rows: list[dict[str, Any]], root: Path, spec: str, by: Winner) -> None:
    """Over several node counts or with a goal: the answer so far, the one `sweep best --by` gives."""
    from rich.text import Text

    from sweeper.errors import SweepError
    from sweeper.results.answer import measured_answer
    from sweeper.results.rows import sweep_as_run

    try:
        sweep = sweep_as_run(root, spec)
    except SweepError:  # no readable sweep file: the table above is all there is
        return
    answer = measured_answer(rows, sweep, by)
    if answer.found is not None:
        console.print(Text(f"so far {answer.line()}"), soft_wrap=True)
