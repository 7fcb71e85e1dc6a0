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


# Each command's module, imported when that command runs (`sweep trial`, once per local trial, then imports
# no planner, search or report: about 0.3 s of CPU a trial); all of them for `sweep`, `sweep --help` or a
# name that is none of them (its error lists them). Each is `sweeper/cli/<name>.py`, its command `<name>`.
COMMANDS = ("run", "best", "status", "trial", "report", "compare", "selftest", "profile")


def _register(names: tuple[str, ...]) -> None:
    import importlib

    have = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for name in names:
        if name in have:  # `main` runs more than once in one process (a test's in-process `sweep`)
            continue
        module = importlib.import_module(f"sweeper.cli.{name}")
        if name == "profile":
            app.add_typer(module.profile_app, name=name, help=module.__doc__)
        else:
            app.command(name, help=module.__doc__)(getattr(module, name))


def _commands_for(args: list[str]) -> tuple[str, ...]:
    """The commands `sweep ARGS` may run: the one it names first, or every one."""
    return (args[0],) if args and args[0] in COMMANDS else COMMANDS


def main() -> None:
    """Console-script entry point: every user error (a SweepError) becomes one line and its exit code, here only."""
    _register(_commands_for(sys.argv[1:]))
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
