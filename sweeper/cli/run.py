"""Plan a sweep and run its trials; `--dry-run` shows what would run, what is pruned, and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from sweeper.errors import SweepError


def run(
    spec: Annotated[str, typer.Argument(help="sweep file: a path, or a bare name found here or among the shipped spaces")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="plan only: show candidates and pruned layouts; submit nothing")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="write the whole plan, one row per layout, as .parquet or .csv")] = None,
    limit: Annotated[int, typer.Option("--limit", help="candidate rows to show (0: all)")] = 40,
    as_json: Annotated[bool, typer.Option("--json", help="print the plan summary and candidates as JSON")] = False,
) -> None:
    from sweeper.cli import abort
    from sweeper.plan import make_plan
    from sweeper.spec import load_sweep

    try:
        sweep = load_sweep(spec)
        plan = make_plan(sweep)
        if out is not None:
            write_plan(plan, out)
    except SweepError as e:
        from rich.markup import escape

        abort(escape(str(e)))
    if not dry_run:
        abort("running trials needs the orchestrator, which this version does not have yet; use --dry-run")
    if as_json:
        typer.echo(json.dumps(plan_summary(plan), indent=2))
    else:
        from sweeper.cli.render import print_plan

        print_plan(plan, limit=limit)


def write_plan(plan, path: Path) -> None:  # noqa: ANN001 - Plan, imported lazily
    """Write the plan atomically (temp file + rename) as Parquet or CSV, by the file's extension."""
    suffix = path.suffix.lower()
    if suffix not in (".parquet", ".csv"):
        raise SweepError(f"--out {path}: the extension must be .parquet or .csv, got {suffix or 'none'!r}")
    if not path.parent.is_dir():
        raise SweepError(f"--out {path}: folder {path.parent} does not exist")
    frame = plan.to_frame()
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        if suffix == ".parquet":
            frame.to_parquet(tmp, index=False)
        else:
            frame.to_csv(tmp, index=False)
        tmp.replace(path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SweepError(f"--out {path}: cannot write: {e.strerror}") from None


def plan_summary(plan) -> dict:  # noqa: ANN001
    """The dry run as data: counts, rejections per reason, and the candidate layouts."""
    frame = plan.to_frame()
    cands = frame[frame.status == "candidate"]
    return {
        "name": plan.sweep.name,
        "layouts": len(plan),
        "counts": plan.counts(),
        "reasons": plan.reason_counts(),
        "candidates": json.loads(cands.drop(columns=["status", "reason"]).to_json(orient="records")),
    }
