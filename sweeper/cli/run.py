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
    fresh: Annotated[bool, typer.Option("--fresh", help="discard this sweep's results and study, and start over")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask before --fresh deletes results")] = False,
    top: Annotated[int, typer.Option("--top", help="layouts to show at the end")] = 5,
) -> None:
    from sweeper.cli import abort
    from sweeper.plan import make_plan
    from sweeper.spec import load_sweep

    from rich.markup import escape

    try:
        sweep = load_sweep(spec)
        from sweeper.launchers import resolve_profile

        resolve_profile(sweep)  # a bad launcher profile is an error of the plan too
        plan = make_plan(sweep)
        if out is not None:
            write_plan(plan, out)
    except SweepError as e:
        abort(escape(str(e)))
    if not dry_run:
        try:
            run_sweep(sweep, fresh=fresh, yes=yes, top=top)
        except SweepError as e:
            abort(escape(str(e)))
        return
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


def run_sweep(sweep, *, fresh: bool, yes: bool, top: int) -> None:  # noqa: ANN001 - Sweep
    """The real run: lock, (fresh start), plan, loop with a live display, then the best layouts."""
    import signal
    import shutil

    from rich.console import Console

    from sweeper.cli.best import print_best
    from sweeper.cli.progress import LiveProgress
    from sweeper.launchers import make_launcher
    from sweeper.lock import SweepLock
    from sweeper.orchestrator import prepare, run_loop
    from sweeper.results import ResultsStore

    err = Console(stderr=True)
    root = sweep.results_path
    with SweepLock(root):
        if fresh and any(p.name != "run.lock" for p in root.iterdir()):
            if not yes and not typer.confirm(f"delete every result of {sweep.name} under {root}?", err=True):
                raise SweepError("--fresh: not confirmed; nothing deleted")
            _discard_results(sweep, root)
        run = prepare(sweep, make_launcher(sweep))
        progress = LiveProgress(err)
        previous = signal.getsignal(signal.SIGINT)

        def on_interrupt(signum, frame):  # noqa: ANN001
            if run.stop_requested:
                raise KeyboardInterrupt
            run.stop_requested = True
            err.print("[yellow]interrupted: no new trials; press Ctrl-C again to quit at once[/]")

        signal.signal(signal.SIGINT, on_interrupt)
        try:
            run_loop(run, progress=progress)
        finally:
            signal.signal(signal.SIGINT, previous)
            progress.stop()
        for w in [*run.store.warnings, *run.warnings]:
            err.print(f"[yellow]warning:[/] {w}")
        if run.running:
            err.print(
                f"[yellow]{len(run.running)} trial(s) still running "
                f"({', '.join(i.handle.job_id for i in run.running.values())}); "
                f"`sweep run` again re-attaches to them[/]"
            )
    if run.fatal:
        raise SweepError(f"{sweep.name}: stopped after one trial, this machine cannot run the sweep: {run.fatal}")
    print_best(ResultsStore(root).rows(), top=top, title=f"{sweep.name}: best layouts")


def _discard_results(sweep, root: Path) -> None:  # noqa: ANN001
    """Remove everything of the sweep but the lock we hold (and its study in external storage)."""
    import shutil

    for p in root.iterdir():
        if p.name == "run.lock":
            continue
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    if sweep.search.storage:
        import optuna

        try:
            optuna.delete_study(study_name=sweep.name, storage=sweep.search.storage)
        except KeyError:
            pass
