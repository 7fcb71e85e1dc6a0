"""Launcher profiles (`launchers/*.yaml` or an inline mapping): validated here, without submitit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from sweeper.errors import SpecError
from sweeper.spec import Sweep, format_validation_error

# Values that end up on an sbatch/srun line: no spaces, quotes or shell metacharacters.
_SAFE = r"^[A-Za-z0-9_.,:=/+@%-]*$"
SafeToken = Annotated[str, StringConstraints(pattern=_SAFE, max_length=256)]
OptionName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LocalProfile(_Profile):
    """Trials as processes on this machine."""

    kind: Literal["local"]


class SlurmProfile(_Profile):
    """Trials as SLURM jobs through submitit: nodes and tasks from the sweep's cluster."""

    kind: Literal["slurm"]
    partition: SafeToken | None = None
    account: SafeToken | None = None
    qos: SafeToken | None = None
    constraint: SafeToken | None = None
    exclusive: bool = False
    cpus_per_task: int | None = Field(default=None, ge=1, le=1024, description=(
        "default: the node's CPUs (sinfo) shared among its tasks, one per GPU; OMP_NUM_THREADS follows it"))
    mem_gb: float | None = Field(default=None, gt=0)
    setup: list[Annotated[str, StringConstraints(max_length=1000)]] = Field(
        default_factory=list, description="shell lines run before the trial (module loads, env)")
    sbatch_extra: dict[OptionName, Union[SafeToken, int, bool]] = Field(default_factory=dict)
    srun_args: list[SafeToken] = Field(default_factory=list)
    poll_s: float = Field(default=5.0, gt=0, le=600, description="seconds between status checks")


class ReplayProfile(_Profile):
    """Answers from a table of earlier results (a results dataset, or a CSV/Parquet)."""

    kind: Literal["replay"]
    table: str = Field(min_length=1, description="path of the table; relative to the sweep file's folder")


Profile = Annotated[Union[LocalProfile, SlurmProfile, ReplayProfile], Field(discriminator="kind")]
_ADAPTER: TypeAdapter[Any] = TypeAdapter(Profile)


def profiles_dirs() -> list[Path]:
    """Where profile names are looked up: ./launchers, then those shipped with the package."""
    return [Path.cwd() / "launchers", Path(__file__).resolve().parents[1] / "data" / "launchers"]


def resolve_profile(sweep: Sweep) -> LocalProfile | SlurmProfile | ReplayProfile:
    """The sweep's launcher as a validated profile; errors name the field and the file."""
    spec = sweep.launcher
    source = "launcher"
    if isinstance(spec, str):
        path = next((d / f"{spec}.yaml" for d in profiles_dirs() if (d / f"{spec}.yaml").is_file()), None)
        if path is None:
            if spec in ("local", "slurm"):
                spec = {"kind": spec}
            else:
                known = sorted({p.stem for d in profiles_dirs() if d.is_dir() for p in d.glob("*.yaml")})
                raise SpecError(f"launcher: no profile {spec!r} (profiles: {', '.join(known)})")
        else:
            source = str(path)
            try:
                spec = yaml.safe_load(path.read_text()) or {}
            except (OSError, yaml.YAMLError) as e:
                raise SpecError(f"{path}: cannot read the launcher profile: {' '.join(str(e).split())}") from None
    if not isinstance(spec, dict):
        raise SpecError(f"{source}: a launcher profile must be a mapping with a 'kind'")
    try:
        return _ADAPTER.validate_python(spec)
    except ValidationError as e:
        msg = format_validation_error(e)
        msg = re.sub(r"\b(local|slurm|replay)\.", "", msg)  # drop the discriminator from field paths
        raise SpecError(f"{source}: {msg}") from None
