"""Measure this node for the step-time model (GEMMs, attention kernels, memory-bound work, launch
overhead, collectives) and write a profile file; `show` prints one, `forget` deletes cached ones."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from sweeper.errors import SweepError


class _FileOrCommand(TyperGroup):
    """`sweep profile [SWEEP_FILE]` and `sweep profile show|forget ...`: a first word that names a
    subcommand is one, anything else is the sweep file."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:  # type: ignore[override]
        # a plain command's parsing (typer.core.TyperGroup's base): options before or after the file
        command: Any = super(TyperGroup, self)
        if args and args[0] in self.commands:
            command.parse_args(ctx, [])  # the group's own options: their defaults
            ctx._protected_args, ctx.args = args[:1], args[1:]
            return ctx.args
        ctx.allow_interspersed_args, ctx.allow_extra_args = True, False
        rest: list[str] = command.parse_args(ctx, args)
        return rest


profile_app = typer.Typer(
    cls=_FileOrCommand,
    help=__doc__,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@profile_app.callback(invoke_without_command=True)
def profile(
    ctx: typer.Context,
    spec: Annotated[
        str | None,
        typer.Argument(
            metavar="[SWEEP_FILE]",
            help="measure this sweep's shapes (default: a default set, README 'Knowing the machine')",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="where to write the profile (default: the user's cache, where the model finds it)"),
    ] = None,
    quick: Annotated[bool, typer.Option("--quick", help="fewer shapes and repetitions: seconds, not minutes")] = False,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console

    from sweeper.profiler import run_profile

    sweep = None
    if spec is not None:
        from sweeper.spec import load_sweep

        sweep = load_sweep(spec)
    if out is not None and out.suffix.lower() not in (".yaml", ".yml"):
        raise SweepError(f"--out {out}: a profile is YAML; the extension must be .yaml or .yml")
    if out is not None and not out.parent.is_dir():
        raise SweepError(f"--out {out}: folder {out.parent} does not exist")
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    start = time.monotonic()

    def progress(what: str) -> None:
        err.print(f"[dim]profile {time.monotonic() - start:6.1f} s:[/] {what}")

    done = run_profile(sweep, out=out, quick=quick, progress=progress)
    for what, why in done.skipped.items():
        err.print(f"[yellow]left out:[/] {what}: {why}")
    typer.echo(f"profile of {done.profile.device} written to {done.path} in {time.monotonic() - start:.0f} s")


@profile_app.command("show")
def show(path: Annotated[Path, typer.Argument(help="a profile file (measured or learned)")]) -> None:
    """Print what a profile holds and where each number came from."""
    for line in describe_file(path):
        typer.echo(line)


@profile_app.command("forget")
def forget(
    path: Annotated[Path | None, typer.Argument(help="a cached profile file to delete")] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="delete the cached measured profile of this GPU (a GPU table key)")
    ] = None,
) -> None:
    """Delete cached profiles: one file, or a GPU's measured profile (--gpu), or every measured profile."""
    from sweeper.profile import cache_dir, cached_profile_path

    if path is not None and gpu is not None:
        raise SweepError("give a profile file or --gpu, not both")
    if path is not None:
        describe_file(path)  # refuses a file that is no profile before deleting it
        targets = [path]
    elif gpu is not None:
        targets = [cached_profile_path(gpu)]
        if not targets[0].exists():
            raise SweepError(f"--gpu {gpu}: no cached profile at {targets[0]}")
    else:
        targets = sorted(cache_dir().glob("*.profile.yaml"))
    for target in targets:
        target.unlink()
        typer.echo(f"deleted {target}")
    if not targets:
        typer.echo(f"no cached profile in {cache_dir()}")


def describe_file(path: Path) -> list[str]:
    """The lines `show` prints, by the file's `kind:` (a learned profile is `sweeper.learned_profile`'s)."""
    from sweeper.profile import LEARNED, describe, load_profile, read_header

    header: dict[str, Any] = read_header(path)
    if header.get("kind") == LEARNED:
        import importlib

        from sweeper.profile import ProfileError

        try:
            learned = importlib.import_module("sweeper.learned_profile")
        except ModuleNotFoundError:
            raise ProfileError(f"{path}: kind: learned is not readable by this version of sweep") from None
        lines: list[str] = learned.describe(path)
        return lines
    return describe(load_profile(path), path)
