"""The `sweep` command. Each subcommand lives in its own module and imports heavy things lazily.

May import: every folder.
"""

from __future__ import annotations

import sys
from typing import Annotated, NoReturn

import typer

from sweeper.errors import SweepError

app = typer.Typer(
    name="sweep",
    help="Find the fastest parallel layout for training a large transformer on a SLURM cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        import sweeper

        typer.echo(f"sweep {sweeper.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    """Find the fastest parallel layout for training a large transformer on a SLURM cluster."""


def abort(message: str, *, code: int = 2) -> NoReturn:
    """Print one styled error line on stderr and exit; the single way user errors leave the CLI."""
    from rich.console import Console

    # soft_wrap: never wrapped, so a path in it is never cut (a terminal folds the long line itself)
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {message}", markup=True)
    raise typer.Exit(code)


def _register() -> None:
    from sweeper.cli import best as best_cmd
    from sweeper.cli import compare as compare_cmd
    from sweeper.cli import profile as profile_cmd
    from sweeper.cli import report as report_cmd
    from sweeper.cli import run as run_cmd
    from sweeper.cli import selftest as selftest_cmd
    from sweeper.cli import status as status_cmd
    from sweeper.cli import trial as trial_cmd

    app.command("run", help=run_cmd.__doc__)(run_cmd.run)
    app.command("best", help=best_cmd.__doc__)(best_cmd.best)
    app.command("status", help=status_cmd.__doc__)(status_cmd.status)
    app.command("trial", help=trial_cmd.__doc__)(trial_cmd.trial)
    app.command("report", help=report_cmd.__doc__)(report_cmd.report)
    app.command("compare", help=compare_cmd.__doc__)(compare_cmd.compare)
    app.command("selftest", help=selftest_cmd.__doc__)(selftest_cmd.selftest)
    app.add_typer(profile_cmd.profile_app, name="profile", help=profile_cmd.__doc__)


_register()


def main() -> None:
    """Console-script entry point: every user error (a SweepError) becomes one line and its exit code, here only."""
    try:
        app()
    except SweepError as e:
        from sweeper.text import for_markup

        try:
            abort(for_markup(str(e)), code=e.exit_code)
        except typer.Exit as ex:
            sys.exit(ex.exit_code)
    except PermissionError as e:  # another user's results folder or file: one line, never a traceback
        from sweeper.text import for_markup

        try:
            abort(for_markup(denied(e)), code=2)
        except typer.Exit as ex:
            sys.exit(ex.exit_code)


def denied(e: PermissionError) -> str:
    """What a PermissionError says as one line: the path, its owner where it can be seen, what to do."""
    import os

    path = e.filename or "a file"
    try:
        owner = os.stat(path).st_uid if e.filename else None
    except OSError:
        owner = None
    whose = f" (owned by user {owner}, not you: {os.geteuid()})" if owner is not None and owner != os.geteuid() else ""
    return (
        f"{path}: {e.strerror or 'permission denied'}{whose}; a results folder or file of another user's "
        "is theirs to share (ask them for a copy), or give the sweep a results_dir of your own"
    )
