"""Launcher profiles (`launchers/*.yaml` or an inline mapping): found, read and validated here.

The profile's `kind` picks its launcher in the registry; that launcher's profile model validates
the rest. No launcher is named here.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from sweeper.errors import SpecError
from sweeper.launchers.base import LauncherProfile
from sweeper.launchers.registry import launcher_classes
from sweeper.spec.sweep import Sweep
from sweeper.yamltext import load_yaml


def profiles_dirs() -> list[Path]:
    """Where profile names are looked up: ./launchers, then those shipped with the package."""
    return [Path.cwd() / "launchers", Path(__file__).resolve().parents[1] / "data" / "launchers"]


def resolve_profile(sweep: Sweep) -> LauncherProfile:
    """The sweep's launcher as a validated profile; errors name the field and the file."""
    spec = sweep.launcher
    source = "launcher"
    if isinstance(spec, str):
        path = next((d / f"{spec}.yaml" for d in profiles_dirs() if (d / f"{spec}.yaml").is_file()), None)
        if path is None:
            if spec in _bare_kinds():  # `launcher: slurm` with no slurm.yaml: the profile's defaults
                spec = {"kind": spec}
            else:
                known = sorted({p.stem for d in profiles_dirs() if d.is_dir() for p in d.glob("*.yaml")})
                raise SpecError(f"launcher: no profile {spec!r} (profiles: {', '.join(known)})")
        else:
            source = str(path)
            try:
                text = path.read_text()
            except OSError as e:
                raise SpecError(f"{path}: cannot read the launcher profile: {e.strerror or e}") from None
            spec = load_yaml(text, f"{path}: the launcher profile") or {}
    if not isinstance(spec, dict) or "kind" not in spec:
        raise SpecError(f"{source}: a launcher profile must be a mapping with a 'kind'")
    registry = launcher_classes()
    site_only = dict.fromkeys(k for cls in registry.values() if cls.profile_model for k in cls.profile_model.site_only)
    inline = [k for k in site_only if k in spec] if source == "launcher" else []
    if inline:
        raise SpecError(
            f"launcher.{inline[0]}: not allowed in a sweep file's inline launcher (a shared file must not add "
            f"job-script lines or options); put {', '.join(inline)} in a profile under launchers/ and name it"
        )
    launcher = registry.get(str(spec["kind"]))
    if launcher is None or launcher.profile_model is None:
        raise SpecError(f"{source}: kind: {spec['kind']!r} is not a launcher; kinds: {', '.join(registry)}")
    model = launcher.profile_model
    try:
        profile = model.model_validate(spec)
    except ValidationError as e:
        raise SpecError(f"{source}: {_message(e, model)}") from None
    profile.check(source)
    inline = profile.site_only_settings() if source == "launcher" else []
    if inline:
        raise SpecError(
            f"launcher.{inline[0]}: not allowed in a sweep file's inline launcher (a shared file must not set "
            f"what reaches into the machines trials run on); put it in a profile under launchers/ and name it"
        )
    return profile


def _message(e: ValidationError, model: type[LauncherProfile]) -> str:
    """One entry per problem: the field, then what is wrong and what is allowed."""
    lines = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field; allowed: {', '.join(model.model_fields)}"
        elif err["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(dict.fromkeys(lines))


def _bare_kinds() -> list[str]:
    """The kinds a sweep file may name without a profile file: those whose profile needs nothing but its kind."""
    return [
        kind
        for kind, cls in launcher_classes().items()
        if cls.profile_model is not None
        and not any(f.is_required() for name, f in cls.profile_model.model_fields.items() if name != "kind")
    ]
