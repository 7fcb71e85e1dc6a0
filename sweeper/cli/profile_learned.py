"""What `sweep profile show` and `sweep profile forget --learned` do for learned profiles.

The `sweep profile` group (sweeper/cli/profile.py) dispatches here: `show FILE` on a file whose
`kind:` is `learned` prints `describe`'s lines; `forget --learned [KEY]` calls `forget_learned`.
`learned_app` holds the same two as commands of their own, for use before that group exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sweeper.errors import SpecError

learned_app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


@learned_app.command("show-learned")
def show_learned(
    file: Annotated[
        Path | None, typer.Argument(help="a learned profile file; none: list the learned profiles of this user")
    ] = None,
) -> None:
    """Print what a learned profile holds and which sweep each number came from."""
    from sweeper.learned_profile import describe, learned_dir

    if file is not None:
        if not file.is_file():
            raise SpecError(f"{file}: no such learned profile (they are under {learned_dir()})")
        for line in describe(file):
            typer.echo(line)
        return
    found = sorted(learned_dir().glob("*.yaml")) if learned_dir().is_dir() else []
    if not found:
        typer.echo(f"no learned profile under {learned_dir()}")
    for path in found:
        typer.echo(describe(path)[0])


@learned_app.command("forget-learned")
def forget_learned(
    key: Annotated[
        str | None,
        typer.Argument(help="a learned profile (its file or its name) or a sweep file (its cluster's); none: all"),
    ] = None,
) -> None:
    """Remove a learned profile (every learned profile when no KEY is given)."""
    from sweeper.learned_profile import forget

    removed = forget(None if key is None else resolve_key(key))
    for path in removed:
        typer.echo(f"removed {path}")
    if not removed:
        typer.echo("no learned profile to remove")


def resolve_key(text: str):  # noqa: ANN201 - LearnedKey, imported lazily
    """The key KEY names: a learned profile's file or file name (without .yaml), else a sweep file's."""
    from sweeper.learned_profile import learned_dir, read

    path = Path(text)
    named = learned_dir() / f"{path.name.removesuffix('.yaml')}.yaml"
    for candidate in (path, named):
        if candidate.is_file() and candidate.suffix == ".yaml" and _is_learned(candidate):
            return read(candidate).key
    from sweeper.cli.run import cluster_of
    from sweeper.learned_profile import LearnedKey
    from sweeper.spec import load_sweep

    try:
        sweep = load_sweep(text)
    except SpecError:
        raise SpecError(
            f"{text}: neither a learned profile (under {learned_dir()}) nor a sweep file; "
            "`show-learned` lists the learned profiles"
        ) from None
    return LearnedKey.of(sweep, cluster_of(sweep))


def _is_learned(path: Path) -> bool:
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and data.get("kind") == "learned"
