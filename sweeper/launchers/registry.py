"""The launchers by kind, derived from the classes (as submitit derives its executors from its plugins).

Every module of this package is imported and each concrete `Launcher` subclass with a profile
model is registered under its `kind`: a new launcher is one module here, its class and its
profile model, and no list names it again.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Any, get_args

from sweeper.launchers.base import Launcher


def launcher_classes() -> dict[str, type[Launcher]]:
    """Every launcher of the package by its kind, in the order of the kinds' names."""
    package = __name__.rsplit(".", 1)[0]
    for module in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{package}.{module.name}")
    found: dict[str, type[Launcher]] = {}
    for cls in _subclasses(Launcher):
        if inspect.isabstract(cls) or not cls.__module__.startswith(f"{package}."):
            continue  # a test double or a benchmark's instant launcher is no launcher of the sweep file
        if cls.profile_model is None:
            raise TypeError(f"{cls.__qualname__}: a launcher needs a profile_model (a LauncherProfile subclass)")
        tags = get_args(cls.profile_model.model_fields["kind"].annotation)
        if tags != (cls.kind,):
            raise TypeError(f"{cls.__qualname__}: kind {cls.kind!r} but its profile accepts kind {tags}")
        if cls.kind in found:
            raise TypeError(
                f"launcher kind {cls.kind!r} defined twice: {found[cls.kind].__qualname__}, {cls.__qualname__}"
            )
        found[cls.kind] = cls
    return dict(sorted(found.items()))


def _subclasses(cls: type[Any]) -> list[type[Any]]:
    direct = cls.__subclasses__()
    return direct + [sub for d in direct for sub in _subclasses(d)]
