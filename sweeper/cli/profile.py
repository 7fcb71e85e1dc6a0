"""Measure this node for the step-time model (GEMMs, attention kernels, memory-bound work, launch
overhead, collectives) and write a profile file; `show` prints one, `forget` deletes cached ones."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from sweeper.errors import SweepError
from sweeper.text import for_markup, for_terminal


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
            help="measure this sweep's shapes (default: a default set; docs/profiles.md, 'sweep profile: measure the node')",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="where to write the profile (default: the user's cache, where the model finds it)"),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="fewer shapes and repetitions: about a minute on a CPU node, a first look")
    ] = False,
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes",
            help="measure as one job of this many nodes, adding the collectives across the link between them, "
            "through the sweep's launcher: one SLURM job (launcher slurm), else the local cluster of "
            "scripts/netns/start.sh",
        ),
    ] = 1,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    from rich.console import Console

    from sweeper.run.profiler import run_profile

    sweep = None
    if spec is not None:
        from sweeper.spec.loader import load_sweep

        sweep = load_sweep(spec)
    if out is not None and out.suffix.lower() not in (".yaml", ".yml"):
        raise SweepError(f"--out {out}: a profile is YAML; the extension must be .yaml or .yml")
    if out is not None and not out.parent.is_dir():
        raise SweepError(f"--out {out}: folder {out.parent} does not exist")
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    start = time.monotonic()

    def progress(what: str) -> None:
        err.print(f"[dim]profile {time.monotonic() - start:6.1f} s:[/] {what}")

    done = run_profile(sweep, out=out, quick=quick, progress=progress, nodes=nodes)
    for what, why in done.skipped.items():
        err.print(f"[yellow]left out:[/] {for_markup(f'{what}: {why}')}")
    took = time.monotonic() - start
    typer.echo(for_terminal(f"profile of {done.profile.device} written to {done.path} in {took:.0f} s"))


@profile_app.command("show")
def show(
    path: Annotated[
        Path | None, typer.Argument(help="a profile file (measured or learned); none: list this user's cached ones")
    ] = None,
) -> None:
    """Print what a profile holds and where each number came from (without a file: the cached profiles)."""
    if path is not None:
        for line in describe_file(path):
            typer.echo(for_terminal(line))
        return
    from sweeper.profiles.cache import cache_dir
    from sweeper.search.learned import learned_dir

    found = sorted(cache_dir().glob("*.profile.yaml")) + sorted(learned_dir().glob("*.yaml"))
    if not found:
        typer.echo(f"no cached profile under {cache_dir()}")
    for p in found:
        typer.echo(for_terminal(describe_file(p)[0]))  # its first line names the file


@profile_app.command("forget")
def forget(
    path: Annotated[
        Path | None, typer.Argument(help="a cached measured profile file to delete (in the cache folder)")
    ] = None,
    gpu: Annotated[
        str | None, typer.Option("--gpu", help="delete the cached measured profile of this GPU (a GPU table key)")
    ] = None,
    learned: Annotated[
        bool,
        typer.Option(
            "--learned",
            help="delete learned profiles: the one FILE names (its file, its name, or a sweep file's cluster), else all",
        ),
    ] = False,
) -> None:
    """Delete cached profiles: one file, a GPU's measured profile (--gpu), every measured profile, or
    learned ones (--learned)."""
    from sweeper.profiles.cache import cache_dir, cached_profile_path

    if path is not None and gpu is not None:
        raise SweepError("give a profile file or --gpu, not both")
    if learned:
        if gpu is not None:
            raise SweepError("--learned and --gpu: a learned profile is named by its file or a sweep file, not a GPU")
        _forget_learned(None if path is None else str(path))
        return
    if path is not None:
        targets = [cached_file(path, f"{path}")]
    elif gpu is not None:
        from sweeper.spec.hardware import lookup_gpu

        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", gpu) or ".." in gpu:
            raise SweepError(f"--gpu {gpu}: not a GPU table key (letters, digits, '_', '.', '-'); nothing deleted")
        known = lookup_gpu(gpu)  # `h100` is the table's h100-sxm, as in a sweep file
        target = cached_profile_path(known.name if known is not None else gpu)
        if not (target.exists() or target.is_symlink()):
            raise SweepError(f"--gpu {gpu}: no cached profile at {target}")
        targets = [cached_file(target, f"--gpu {gpu}")]
    else:
        targets = []
        for p in sorted(cache_dir().glob("*.profile.yaml")):
            try:
                targets.append(cached_file(p, str(p)))
            except SweepError as e:
                typer.echo(for_terminal(f"kept {p}: {e}"), err=True)
    for target in targets:
        target.unlink()
        typer.echo(for_terminal(f"deleted {target}"))
    if not targets:
        typer.echo(f"no cached profile in {cache_dir()}")


def cached_file(path: Path, named: str) -> Path:
    """The cached measured profile `path` names, checked before it is deleted: a regular file (not a
    link, not a folder) directly in the cache folder, named <gpu>.profile.yaml, that reads as a
    measured profile. Anything else is refused in one line, and nothing is deleted."""
    from sweeper.files import FileRefused
    from sweeper.profiles.cache import cache_dir, deletable
    from sweeper.profiles.profile import MEASURED, ProfileError, load_profile

    folder = cache_dir()
    where = f"{named}: nothing deleted"
    if path.is_symlink() or not path.is_file():
        raise SweepError(f"{where}: {path} is not a regular file; `forget` deletes cached profile files only")
    if path.resolve().parent != folder.resolve() or not path.name.endswith(".profile.yaml"):
        raise SweepError(f"{where}: {path} is not a cached profile (<gpu>.profile.yaml in {folder})")
    try:  # a regular file of the user's, in the real cache folder: no link on the way
        deletable(folder / path.name, folder, MEASURED)
    except FileRefused as e:
        raise SweepError(f"{where}: {e}") from None
    try:
        load_profile(path)
    except ProfileError as e:
        raise SweepError(f"{where}: not a measured profile ({e})") from None
    return folder / path.name


def describe_file(path: Path) -> list[str]:
    """The lines `show` prints, by the file's `kind:` (a learned profile is `sweeper.search.learned`'s)."""
    from sweeper.profiles.profile import LEARNED, load_profile, read_header
    from sweeper.profiles.profile_show import describe
    from sweeper.search.learned_show import describe as describe_learned

    header: dict[str, Any] = read_header(path)
    if header.get("kind") == LEARNED:
        return describe_learned(path)
    return describe(load_profile(path), path)


def _forget_learned(key: str | None) -> None:
    """`forget --learned [KEY]`: the learned profile KEY names, or every learned profile."""
    from sweeper.search.learned_show import forget

    removed, kept = forget(None if key is None else _learned_key(key))
    for line in kept:
        typer.echo(for_terminal(line), err=True)
    for path in removed:
        typer.echo(for_terminal(f"deleted {path}"))
    if not removed:
        typer.echo("no learned profile to delete")


def _learned_key(text: str):  # noqa: ANN202 - LearnedKey, imported lazily
    """The key TEXT names: a learned profile's file or file name (without .yaml), else a sweep file's cluster."""
    from sweeper.cli.run import cluster_of
    from sweeper.errors import SpecError
    from sweeper.profiles.profile import LEARNED, ProfileError, read_header
    from sweeper.search.learned import LearnedKey, learned_dir, read
    from sweeper.spec.loader import load_sweep

    path = Path(text)
    for candidate in (path, learned_dir() / f"{path.name.removesuffix('.yaml')}.yaml"):
        if not (candidate.is_file() and candidate.suffix == ".yaml"):
            continue
        try:
            if read_header(candidate).get("kind") == LEARNED:
                return read(candidate).key
        except ProfileError:
            pass  # not a profile at all: perhaps a sweep file
    try:
        sweep = load_sweep(text)
    except SpecError:
        raise SpecError(
            f"{text}: neither a learned profile (under {learned_dir()}) nor a sweep file; "
            "`sweep profile show` lists the cached profiles"
        ) from None
    return LearnedKey.of(sweep, cluster_of(sweep))
