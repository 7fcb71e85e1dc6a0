"""Launcher profiles (`launchers/*.yaml` or an inline mapping): validated here, without submitit."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, TypeAdapter, ValidationError

from sweeper.errors import SpecError
from sweeper.spec import Sweep, format_validation_error

# Values that end up on an sbatch/srun line: no spaces, quotes or shell metacharacters.
_SAFE = r"^[A-Za-z0-9_.,:=/+@%-]*$"
SafeToken = Annotated[str, StringConstraints(pattern=_SAFE, max_length=256)]
OptionName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_-]{0,63}$")]


# Options that redirect a job's output, environment, folder or requeueing: a profile could
# append to ~/.bashrc, LD_PRELOAD a library or rerun jobs unseen. Denied unless a profile allows them.
DENIED_DIRECTIVES = ("output", "error", "export", "chdir", "requeue", "wrap")
_SHORT = {"o": "output", "e": "error", "D": "chdir"}
# A sweep file is shared and copied; a profile under launchers/ is site configuration: only there.
PROFILE_ONLY = ("setup", "sbatch_extra", "srun_args", "allow_directives")
MAX_LOCAL_PROCESSES = 64  # the local launcher starts one process per device of the cluster


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
    cpus_per_task: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description=(
            "default: the node's CPUs (sinfo) shared among its tasks, one per GPU; OMP_NUM_THREADS follows it"
        ),
    )
    mem_gb: float | None = Field(default=None, gt=0)
    setup: list[Annotated[str, StringConstraints(max_length=1000)]] = Field(
        default_factory=list, description="shell lines run before the trial (module loads, env)"
    )
    sbatch_extra: dict[OptionName, SafeToken | int | bool] = Field(default_factory=dict)
    srun_args: list[SafeToken] = Field(default_factory=list)
    allow_directives: list[Literal[DENIED_DIRECTIVES]] = Field(  # type: ignore[valid-type]
        default_factory=list, description="denied sbatch/srun options this site profile may set anyway"
    )
    poll_s: float = Field(default=5.0, gt=0, le=600, description="seconds between status checks")


class ReplayProfile(_Profile):
    """Answers from a table of earlier results (a results dataset, or a CSV/Parquet)."""

    kind: Literal["replay"]
    table: str = Field(min_length=1, description="path of the table; relative to the sweep file's folder")


Profile = Annotated[LocalProfile | SlurmProfile | ReplayProfile, Field(discriminator="kind")]
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
    inline = [k for k in PROFILE_ONLY if k in spec] if source == "launcher" else []
    if inline:
        raise SpecError(
            f"launcher.{inline[0]}: not allowed in a sweep file's inline launcher (a shared file must not add "
            f"job-script lines or options); put {', '.join(inline)} in a profile under launchers/ and name it"
        )
    try:
        profile = _ADAPTER.validate_python(spec)
    except ValidationError as e:
        msg = format_validation_error(e)
        msg = re.sub(r"\b(local|slurm|replay)\.", "", msg)  # drop the discriminator from field paths
        raise SpecError(f"{source}: {msg}") from None
    if isinstance(profile, SlurmProfile):
        _check_directives(profile, source)
    return profile


def check_local_capacity(sweep: Sweep) -> None:
    """The local launcher starts one process per device: refuse a cluster it cannot stand in for.

    Checked when a sweep is about to run (not for a dry run, which plans any cluster), before
    anything is created.
    """
    if sweep.cluster.world > MAX_LOCAL_PROCESSES:
        raise SpecError(
            f"launcher: the local launcher starts one process per device ({sweep.cluster.nodes} x "
            f"{sweep.cluster.gpus_per_node} = {sweep.cluster.world}), more than {MAX_LOCAL_PROCESSES}; use a SLURM profile"
        )


def _directive(option: str) -> str:
    """`--open-mode`, `output`, `-o`, `no_requeue` -> the option's long name with dashes."""
    name = option.lstrip("-").split("=", 1)[0].replace("_", "-")
    return _SHORT.get(name[:1], name) if option.startswith("-") and not option.startswith("--") else name


def _check_directives(profile: SlurmProfile, source: str) -> None:
    allowed = set(profile.allow_directives)
    given = [(f"sbatch_extra.{k}", _directive(k)) for k in profile.sbatch_extra]
    given += [(f"srun_args {a!r}", _directive(a)) for a in profile.srun_args if a.startswith("-")]
    for where, name in given:
        bare = name.removeprefix("no-")  # --no-requeue is requeueing too (and the launcher sets it itself)
        if bare in DENIED_DIRECTIVES and bare not in allowed:
            raise SpecError(
                f"{source}: {where}: the {bare!r} option redirects a job's output, environment, folder or requeueing "
                f"and is denied; a site profile may allow it with `allow_directives: [{bare}]`"
            )
