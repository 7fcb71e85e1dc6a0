"""Reading a sweep file: finding it by path or name, YAML without surprises (no aliases, no
duplicate keys, a size cap), then the schema (`sweeper.spec.schema`) and the checks that need the
layout rules (a searched value no layout can use)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sweeper.errors import SpecError
from sweeper.files import FileRefused, SweepYamlLoader, parse_yaml, read_limited
from sweeper.knobs import KNOBS
from sweeper.layouts.layout import DECIDED_ALONE, unusable
from sweeper.profiles.cache import cached_profile_path, check_cached
from sweeper.profiles.lookup import MeasuredProfile
from sweeper.profiles.profile import ProfileError, load_profile
from sweeper.spec.checks import check_layout_count
from sweeper.spec.hardware import alias_of
from sweeper.spec.hf_config import ModelFile, read_config, resolve
from sweeper.spec.messages import format_validation_error
from sweeper.spec.models import PRESETS, ModelShape
from sweeper.spec.schema import MAX_LAYOUTS, HFConfigSpec, ModelSpec, SweepFile
from sweeper.spec.sweep import Cluster, Sweep
from sweeper.trainers import RECIPES, TRAINERS

MAX_SPEC_BYTES = 1 << 20  # a sweep file is a few dozen lines; anything bigger is a mistake


def model_shape(model: str | ModelSpec | HFConfigSpec, source: Path | None) -> tuple[ModelShape, ModelFile | None]:
    """The shape `model:` gives: a preset's, the mapping's, or a config.json's (read relative to the
    sweep file's folder), with that file."""
    if isinstance(model, str):
        return PRESETS[model.lower()], None
    if isinstance(model, ModelSpec):
        return model.shape(), None
    base = source.parent if source is not None else Path.cwd()
    file, fields = read_config(resolve(model.hf_config, base))
    try:
        spec = ModelSpec.model_validate(fields)
    except ValidationError as e:
        raise SpecError(f"model.hf_config: {file.path}: {format_validation_error(e)}") from None
    return spec.shape(file.architecture), file


def build_sweep(raw: SweepFile, *, source: Path | None = None, profiles: bool = True) -> Sweep:
    """Resolve presets and check that every searched value can appear in some valid layout;
    `profiles`: read the cluster's measured profile (`cluster.profile`, else the user's cached one)."""
    shape, model_file = model_shape(raw.model, source)
    if shape.position == "learned" and shape.max_positions < raw.seq_len:
        # the table must hold every position trained (Megatron-LM: --max-position-embeddings >= --seq-length)
        shape = replace(shape, max_positions=raw.seq_len)
    sizes = raw.cluster.sizes
    gpu = raw.cluster.resolved_gpu()
    kept = Path(raw.results_dir) / raw.name / KEPT_PROFILE
    base = source.parent if source is not None else None
    measured = (
        cluster_profile(raw.cluster.profile, gpu.name, base=base, kept=kept, link=raw.cluster.link)
        if profiles
        else None
    )
    cluster = Cluster(sizes[0], raw.cluster.gpus_per_node, gpu, measured, raw.cluster.link)
    space = raw.space.values()
    check_layout_count(space, MAX_LAYOUTS)  # before anything allocates the cross product
    sweep = Sweep(
        name=raw.name,
        model=shape,
        seq_len=raw.seq_len,
        global_batch_size=raw.global_batch_size,
        cluster=cluster,
        space=space,
        trial=raw.trial,
        search=raw.search,
        memory=raw.memory,
        launcher=raw.launcher,
        results_dir=Path(raw.results_dir),
        source=source,
        workload=raw.workload,
        sizes=sizes if isinstance(raw.cluster.nodes, list) else (),
        goal=raw.goal,
        gpu_alias=raw.cluster.gpu if isinstance(raw.cluster.gpu, str) and alias_of(raw.cluster.gpu) else "",
        model_file=model_file,
        trainer=TRAINERS[raw.workload.kind],
        memory_recipe=RECIPES[raw.memory.recipe],
    )
    _check_sizes(sweep)
    _check_usable(sweep)
    return sweep


def _check_sizes(sweep: Sweep) -> None:
    """Each listed node count must have some layout its GPUs and the global batch can use: a tp*cp*pp
    of the space dividing its world, and a micro-batch size times the dp left dividing the batch."""
    if not sweep.several_sizes:
        return
    s = sweep.space
    for n in sweep.node_counts:
        world = n * sweep.cluster.gpus_per_node
        usable = any(
            world % (tp * cp * pp) == 0 and sweep.global_batch_size % (mbs * (world // (tp * cp * pp))) == 0
            for tp in s["tp"]
            for cp in s["cp"]
            for pp in s["pp"]
            for mbs in s["micro_batch_size"]
        )
        if not usable:
            raise SpecError(
                f"cluster.nodes: {n} cannot be used: no tp*cp*pp of the space divides world = {world} GPUs "
                f"with micro_batch_size*dp dividing global_batch_size = {sweep.global_batch_size}"
            )


# the copy of the measured profile a sweep priced from, kept beside its results (`sweeper.results.frozen`)
KEPT_PROFILE = "profile.yaml"


def cluster_profile(
    named: str | None, gpu: str, *, base: Path | None = None, kept: Path | None = None, link: str | None = None
) -> MeasuredProfile | None:
    """The measured profile the model prices from: the file `cluster.profile` names (a relative path
    is the sweep file's folder's, `base`, else the current folder's), else the user's cached profile
    of this GPU if there is one, else None (the GPU table). `kept`: the copy beside the sweep's
    results, read when the named file is gone (moved, forgotten, or the folder copied elsewhere):
    the results open whatever happened to it. A profile that cannot be read, or was measured on
    another GPU or across another link than `cluster.link`, is an error naming `cluster.profile`."""
    if named is None:
        path = cached_profile_path(gpu)
        if not (path.exists() or path.is_symlink()):
            return None
        try:
            check_cached(path)
        except FileRefused as e:
            raise SpecError(f"cluster.profile: the cached profile of {gpu}: {e}") from None
    else:
        p = Path(named).expanduser()
        found = [c for c in ([base / p] if base is not None and not p.is_absolute() else []) + [p] if _exists(c)]
        if found:
            path = found[0]
        elif kept is not None and kept.is_file():
            path = kept  # the file as the sweep priced from it last
        else:
            raise SpecError(f"cluster.profile: {p}: no such profile file (`sweep profile --out {p}` writes one)")
    try:
        return MeasuredProfile(load_profile(path, gpu=gpu, link=link), str(path))
    except ProfileError as e:
        raise SpecError(f"cluster.profile: {e}") from None


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()  # a dangling link, a device: the reader says what it is


def _check_usable(sweep: Sweep) -> None:
    """A tp, pp, cp, ep or etp value that no layout can use is a typo, not a search dimension: say so.

    The rules are the plan's own (`sweeper.layouts.layout.unusable`), written once.
    """
    for knob in DECIDED_ALONE:
        for v in sweep.space[knob]:
            # with several node counts a value is refused only when no size can use it (the first size's words)
            whys = [unusable(knob, v, sweep.at(n)) for n in sweep.node_counts]
            why = whys[0] if all(whys) else []
            if knob == "pp" and v > sweep.model.layers:
                why.append(f"it exceeds layers={sweep.model.layers}")
            if why:
                raise SpecError(f"space.{knob}: value {v} can never be used: {'; '.join(why)}")
    if sweep.model.is_moe and sweep.model.router not in TRAINERS[sweep.workload.kind].routers:
        raise SpecError(
            f"model.router: the {sweep.workload.kind} trainer routes by {', '.join(sorted(TRAINERS[sweep.workload.kind].routers))} "
            f"only, not {sweep.model.router}"
        )
    # ep > 1 on a dense model is refused above by its rule; etp has no value that means anything there
    if not sweep.model.is_moe and sweep.space["etp"] != (KNOBS["etp"].default,):
        raise SpecError(f"space.etp: {sweep.model.name} has no experts; etp applies to MoE models only")
    gbs = sweep.global_batch_size
    for v in sweep.space["micro_batch_size"]:
        if v > gbs:
            raise SpecError(f"space.micro_batch_size: value {v} exceeds global_batch_size={gbs}")


def parse_sweep(text: str | bytes, *, source: str = "<sweep file>", profiles: bool = True) -> Sweep:
    """Validate the text of a sweep file; every problem raises SpecError naming the field.
    `profiles=False` leaves the cluster's measured profile unread (the GPU table prices)."""
    if isinstance(text, bytes):
        if len(text) > MAX_SPEC_BYTES:
            raise SpecError(f"{source}: file is {len(text)} bytes; a sweep file must be under {MAX_SPEC_BYTES}")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    data = read_yaml(text, source)
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of fields (name, model, ...), got {type(data).__name__}")
    try:
        raw = SweepFile.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"{source}: {format_validation_error(e)}") from None
    try:
        return build_sweep(raw, source=Path(source) if source != "<sweep file>" else None, profiles=profiles)
    except SpecError as e:
        raise SpecError(f"{source}: {e}") from None


def read_yaml(text: str, source: str) -> Any:
    """The YAML document (`sweeper.files.parse_yaml`: no aliases, no deep nesting, no key twice, no
    number out of bounds); a problem is one SpecError line naming the file, line and column."""
    try:
        return parse_yaml(text, source, loader=SweepYamlLoader)
    except FileRefused as e:
        raise SpecError(str(e)) from None


def load_sweep(path_or_name: str | Path, *, profiles: bool = True) -> Sweep:
    """Read a sweep file by path, or by bare name in the current directory, then among the shipped
    spaces; `profiles=False`: without the cluster's measured profile (a trial's task needs none)."""
    path = find_sweep_file(path_or_name)
    try:  # bounded before reading: a FIFO or a device named as a sweep file would never end
        data = read_limited(path, max_bytes=MAX_SPEC_BYTES)
    except FileRefused as e:
        raise SpecError(str(e)) from None
    return parse_sweep(data, source=str(path), profiles=profiles)


def shipped_spaces_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "data" / "search_spaces"


def find_sweep_file(path_or_name: str | Path) -> Path:
    p = Path(path_or_name)
    if p.is_file():
        return p
    if p.is_dir():
        raise SpecError(f"{p}: is a folder; give a sweep file (YAML)")
    names = [p.name] if p.suffix in (".yaml", ".yml") else [p.name + ".yaml", p.name + ".yml"]
    if len(p.parts) == 1:
        for base in (Path.cwd(), Path.cwd() / "search_spaces", shipped_spaces_dir()):
            for n in names:
                if (base / n).is_file():
                    return base / n
    shipped = sorted(x.stem for x in shipped_spaces_dir().glob("*.yaml"))
    raise SpecError(f"{path_or_name}: no such sweep file (shipped search spaces: {', '.join(shipped) or 'none'})")
