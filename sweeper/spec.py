"""The sweep file: pydantic models that validate it, and `load_sweep` that turns it into a `Sweep`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sweeper.errors import SpecError
from sweeper.hardware import GPU, GPUS, lookup_gpu
from sweeper.knobs import KNOBS
from sweeper.models import PRESETS, ModelShape

MAX_SPEC_BYTES = 1 << 20  # a sweep file is a few dozen lines; anything bigger is a mistake
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


MAX_LAYOUTS = 1 << 20  # the plan holds every layout in memory (about 1.5 kB each): cap it before it is made
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class _Strict(BaseModel):
    # strict: "64" and 64.0 are not integers, 1 is not a bool; a typo should not change a sweep quietly.
    # allow_inf_nan=False: .nan and .inf are refused as such ("a finite number"), not by a bound
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ModelSpec(_Strict):
    """An explicit model shape, for anything that is not a preset."""

    layers: int = Field(ge=1, le=100_000)
    hidden: int = Field(ge=1, le=1_000_000)
    heads: int = Field(ge=1, le=100_000)
    kv_heads: int | None = Field(default=None, ge=1, le=100_000)
    ffn: int = Field(ge=1, le=10_000_000)
    vocab: int = Field(ge=1, le=100_000_000)
    tied_embeddings: bool = False
    head_dim: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="width of one attention head; default hidden/heads (Qwen3, Gemma set it)",
    )
    mlp: Literal["swiglu", "gelu"] = Field(default="swiglu", description="swiglu (3 matrices) or gelu (2, with biases)")
    norm: Literal["rmsnorm", "layernorm"] = Field(
        default="rmsnorm", description="rmsnorm (weight) or layernorm (weight, bias)"
    )
    position: Literal["rope", "learned"] = Field(default="rope", description="rope, or a learned position table")
    qk_norm: bool = Field(default=False, description="an RMSNorm on queries and keys per head (Qwen3)")
    max_positions: int | None = Field(
        default=None,
        ge=1,
        le=100_000_000,
        description="rows of a learned position table; default (and at least) seq_len",
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> ModelSpec:
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(
                f"hidden must be a multiple of heads, but got hidden={self.hidden}, heads={self.heads} "
                "(or give model.head_dim)"
            )
        if self.head_dim is not None:
            if self.head_dim > self.hidden:
                raise ValueError(
                    f"model.head_dim: {self.head_dim} does not fit the heads: one head wider than hidden={self.hidden}"
                )
            if self.position == "rope" and self.head_dim % 2:
                raise ValueError(
                    f"model.head_dim: {self.head_dim} does not fit the heads: RoPE rotates pairs, so it must be even"
                )
        kv = self.kv_heads or self.heads
        if self.heads % kv:
            raise ValueError(f"heads must be a multiple of kv_heads, but got heads={self.heads}, kv_heads={kv}")
        if self.max_positions is not None and self.position != "learned":
            raise ValueError("model.max_positions: only a learned position table has rows; set position: learned")
        return self

    def shape(self, name: str = "custom") -> ModelShape:
        return ModelShape(
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads or self.heads,
            self.ffn,
            self.vocab,
            self.tied_embeddings,
            name,
            head_dim=self.head_dim or 0,
            mlp=self.mlp,
            norm=self.norm,
            position=self.position,
            qk_norm=self.qk_norm,
            max_positions=self.max_positions or 0,
        )


class GPUSpec(_Strict):
    """A GPU that is not in the table: its memory and dense bf16 peak."""

    name: str = "custom-gpu"
    memory_gib: float = Field(gt=0, le=100_000)
    peak_tflops: float = Field(gt=0, le=1_000_000)
    fp8_tflops: float | None = Field(default=None, gt=0)

    def gpu(self) -> GPU:
        return GPU(self.name, self.memory_gib, self.peak_tflops, None, self.fp8_tflops, "user-defined")


class ClusterSpec(_Strict):
    nodes: int = Field(ge=1, le=100_000)
    gpus_per_node: int = Field(ge=1, le=1024)
    gpu: str | GPUSpec
    intra_node_gbps: float | None = Field(default=None, gt=0, le=100_000, description="GB/s per GPU within a node")
    inter_node_gbps: float | None = Field(default=None, gt=0, le=100_000, description="GB/s per GPU between nodes")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | GPUSpec) -> str | GPUSpec:
        if isinstance(v, str) and lookup_gpu(v) is None:
            raise ValueError(
                f"unknown GPU {v!r}; known: {', '.join(GPUS)} (or give a mapping {{memory_gib, peak_tflops}})"
            )
        return v

    def resolved_gpu(self) -> GPU:
        """The table entry (or the user's card), with the link bandwidths the file overrides."""
        from dataclasses import replace

        gpu = self.gpu.gpu() if isinstance(self.gpu, GPUSpec) else lookup_gpu(self.gpu)
        assert gpu is not None  # checked by the validator
        if self.intra_node_gbps is not None:
            gpu = replace(gpu, intra_gbps=self.intra_node_gbps)
        if self.inter_node_gbps is not None:
            gpu = replace(gpu, inter_gbps=self.inter_node_gbps)
        return gpu

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


class TrialSettings(_Strict):
    """How one trial is run and measured (the 10-step protocol)."""

    steps: int = Field(default=10, ge=2, le=100_000, description="optimizer steps per trial")
    warmup_steps: int = Field(default=1, ge=0, description="steps dropped before averaging")
    timeout_min: float = Field(default=20, gt=0, le=10_000, description="wall-clock limit of one trial")
    precision: Literal["bf16", "fp32"] = Field(default="bf16", description="compute precision")
    seed: int = Field(default=0, ge=0)
    lr: float = Field(default=3e-4, gt=0, le=10)

    @model_validator(mode="after")
    def _warmup_leaves_steps(self) -> TrialSettings:
        if self.warmup_steps >= self.steps:
            raise ValueError(
                f"warmup_steps must be smaller than steps, but got warmup_steps={self.warmup_steps}, steps={self.steps}"
            )
        return self


class SearchSettings(_Strict):
    max_trials: int = Field(default=40, ge=1, le=1_000_000)
    parallel: int = Field(default=1, ge=1, le=10_000)
    sampler: Literal["auto", "grid", "random", "tpe", "gp"] = "auto"
    seed: int = Field(default=0, ge=0)
    storage: str | None = Field(default=None, description="an Optuna storage URL; default SQLite beside the results")
    seed_trials: int | None = Field(
        default=None,
        ge=0,
        le=10_000,
        description="auto: first trials spent on the best-predicted layouts (default: budget/5, 3 to 8)",
    )
    stop_margin: float | None = Field(
        default=None,
        ge=0,
        le=10,
        description="stop early when no untried layout is predicted to beat the best by this share",
    )


RECIPES = ("builtin", "megatron", "torchtitan", "deepspeed", "explicit")
# the recipe a workload kind implies when memory.recipe is not given
RECIPE_OF_WORKLOAD = {"builtin": "builtin", "megatron": "megatron", "torchtitan": "torchtitan", "command": "builtin"}
STATE_PARTS = ("params", "grads", "master", "optimizer")


class StateBytes(_Strict):
    """memory.bytes, the explicit recipe: bytes per parameter of each model state, and which
    of them are sharded over data parallel (when the layout's sharding is not none)."""

    params: float = Field(ge=0, le=64, description="the parameters the forward reads (2: bf16)")
    grads: float = Field(ge=0, le=64, description="the gradients kept between backward and the step")
    master: float = Field(default=0, ge=0, le=64, description="fp32 master weights held by the optimizer")
    optimizer: float = Field(ge=0, le=64, description="optimizer states (AdamW: 8 in fp32)")
    sharded: list[Literal["params", "grads", "master", "optimizer"]] = Field(
        default_factory=list, description="states divided over data parallel"
    )


class MemorySettings(_Strict):
    headroom: float = Field(default=0.05, ge=0, lt=1, description="share of the card kept free")
    overhead_gib: float | None = Field(
        default=None, ge=0, le=1000, description="fixed per-process overhead; default by device type"
    )
    recipe: str | None = Field(
        default=None, description=f"how the trainer holds memory: {', '.join(RECIPES)}; default from workload.kind"
    )
    distributed_optimizer: bool | None = Field(
        default=None,
        description="megatron: --use-distributed-optimizer always (true), never (false), or as sharding says",
    )
    grad_accum_dtype: Literal["fp32", "bf16"] | None = Field(
        default=None,
        description="megatron/deepspeed: dtype of the accumulated gradients (megatron fp32, deepspeed bf16)",
    )
    zero_stage: int | None = Field(
        default=None, ge=0, le=3, description="deepspeed: ZeRO stage; default as sharding says"
    )
    bytes: StateBytes | None = Field(default=None, description="explicit recipe: bytes per parameter")
    compiled_loss: bool | None = Field(
        default=None,
        description="torchtitan: whether compile also compiles the loss (torchtitan since Feb 2025); default true",
    )
    reserved_factor: float | None = Field(
        default=None, ge=1, le=3, description="reserved / allocated of the caching allocator; default by recipe"
    )
    probe_margin: float = Field(
        default=0.05, ge=0, le=1, description="a pruned layout within this share of the card may get one probe trial"
    )

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, v: str | None) -> str | None:
        if v is not None and v not in RECIPES:
            raise ValueError(f"memory.recipe: {v!r} not allowed; allowed: {', '.join(RECIPES)}")
        return v

    @model_validator(mode="after")
    def _options_match_recipe(self) -> MemorySettings:
        r = self.recipe
        if self.distributed_optimizer is not None and r not in (None, "megatron"):
            raise ValueError(f"memory.distributed_optimizer applies to recipe megatron only, not {r!r}")
        if self.zero_stage is not None and r not in (None, "deepspeed"):
            raise ValueError(f"memory.zero_stage applies to recipe deepspeed only, not {r!r}")
        if r == "explicit" and self.bytes is None:
            raise ValueError(
                "memory.bytes is required for recipe explicit: {params, grads, master, optimizer, sharded}"
            )
        if self.grad_accum_dtype is not None and r not in (None, "megatron", "deepspeed"):
            raise ValueError(f"memory.grad_accum_dtype applies to recipes megatron and deepspeed only, not {r!r}")
        if self.compiled_loss is not None and r not in (None, "torchtitan"):
            raise ValueError(f"memory.compiled_loss applies to recipe torchtitan only, not {r!r}")
        if self.bytes is not None and r != "explicit":
            raise ValueError(f"memory.bytes applies to recipe explicit only, not {r!r}")
        return self


class WorkloadSpec(_Strict):
    """What a trial runs: the built-in trainer, or an external trainer's command."""

    kind: Literal["builtin", "megatron", "torchtitan", "command"] = "builtin"
    command: str = Field(
        default="",
        max_length=10_000,
        description="argv template; {flags} = the layout as the trainer's flags, {tp} ... = values",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    cwd: str | None = None

    @model_validator(mode="after")
    def _command_needed(self) -> WorkloadSpec:
        if self.kind != "builtin" and not self.command.strip():
            raise ValueError(f"workload.command is required for kind {self.kind!r} (e.g. 'torchrun ... {{flags}}')")
        from sweeper.spec_checks import check_workload

        check_workload(self.command, self.env, self.cwd)  # at load, not in every trial
        return self


def _space_field(name: str) -> Any:
    knob = KNOBS[name]
    return Field(default=None, min_length=1, max_length=256, description=knob.help)


class SpaceSpec(_Strict):
    """Each knob: the list of values to search. A knob left out takes its default alone."""

    tp: list[int] | None = _space_field("tp")
    pp: list[int] | None = _space_field("pp")
    micro_batch_size: list[int] | None = _space_field("micro_batch_size")
    sequence_parallel: list[bool] | None = _space_field("sequence_parallel")
    activation_checkpointing: list[str] | None = _space_field("activation_checkpointing")
    attention: list[str] | None = _space_field("attention")
    rmsnorm: list[str] | None = _space_field("rmsnorm")
    sharding: list[str] | None = _space_field("sharding")
    pp_schedule: list[str] | None = _space_field("pp_schedule")
    virtual_stages: list[int] | None = _space_field("virtual_stages")
    compile: list[bool] | None = _space_field("compile")
    float8: list[bool] | None = _space_field("float8")

    @model_validator(mode="before")
    @classmethod
    def _scalars_to_lists(cls, data: Any) -> Any:
        # `tp: 2` is read as `tp: [2]`: a single value is a one-element list.
        if isinstance(data, dict):
            return {k: (v if isinstance(v, list) else [v]) for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _values_allowed(self) -> SpaceSpec:
        for name, knob in KNOBS.items():
            values = getattr(self, name)
            if values is None:
                continue
            if len(set(values)) != len(values):
                raise ValueError(f"space.{name} lists a value twice: {values}")
            if knob.choices:
                bad = [v for v in values if v not in knob.choices]
                if bad:
                    raise ValueError(f"space.{name}: {bad} not allowed; allowed: {', '.join(knob.choices)}")
            if knob.kind is int:
                bad = [v for v in values if not 1 <= v <= 1_000_000]
                if bad:
                    raise ValueError(f"space.{name} values must be between 1 and 1000000, but got {bad}")
        return self

    def values(self) -> dict[str, tuple[Any, ...]]:
        """Every knob with its tuple of values (defaults filled in)."""
        out = {}
        for name, knob in KNOBS.items():
            v = getattr(self, name)
            out[name] = tuple(v) if v is not None else (knob.default,)
        return out


class SweepFile(_Strict):
    """The whole sweep file as written."""

    name: str
    model: str | ModelSpec
    seq_len: int = Field(ge=1, le=10_000_000)
    global_batch_size: int = Field(ge=1, le=100_000_000, description="sequences per optimizer step")
    cluster: ClusterSpec
    space: SpaceSpec = SpaceSpec()
    trial: TrialSettings = TrialSettings()
    search: SearchSettings = SearchSettings()
    memory: MemorySettings = MemorySettings()
    launcher: str | dict[str, Any] = "local"
    workload: WorkloadSpec = WorkloadSpec()
    results_dir: str = "results"

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not SAFE_NAME.match(v):
            raise ValueError(f"name must be letters, digits, '_', '.', '-' (a folder name), but got {v!r}")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | ModelSpec) -> str | ModelSpec:
        if isinstance(v, str) and v.lower() not in PRESETS:
            raise ValueError(f"unknown model preset {v!r}; presets: {', '.join(PRESETS)} (or give a mapping)")
        return v

    @field_validator("launcher")
    @classmethod
    def _launcher_name(cls, v: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(v, str) and not SAFE_NAME.match(v):
            raise ValueError(f"launcher must be a profile name (letters, digits, '_', '.', '-'), but got {v!r}")
        if isinstance(v, dict) and not isinstance(v.get("kind"), str):
            raise ValueError("an inline launcher mapping needs a 'kind' (local, slurm, ...)")
        return v


@dataclass(frozen=True)
class Cluster:
    nodes: int
    gpus_per_node: int
    gpu: GPU

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Sweep:
    """A validated sweep: what the planner, the search and the trial runner consume."""

    name: str
    model: ModelShape
    seq_len: int
    global_batch_size: int
    cluster: Cluster
    space: dict[str, tuple[Any, ...]]
    trial: TrialSettings = TrialSettings()
    search: SearchSettings = SearchSettings()
    memory: MemorySettings = MemorySettings()
    launcher: str | dict[str, Any] = "local"
    results_dir: Path = Path("results")
    source: Path | None = field(default=None, compare=False)
    workload: WorkloadSpec = WorkloadSpec()

    @property
    def results_path(self) -> Path:
        return self.results_dir / self.name


def build_sweep(raw: SweepFile, *, source: Path | None = None) -> Sweep:
    """Resolve presets and check that every searched value can appear in some valid layout."""
    shape = PRESETS[raw.model.lower()] if isinstance(raw.model, str) else raw.model.shape()
    if shape.position == "learned" and shape.max_positions < raw.seq_len:
        # the table must hold every position trained (Megatron-LM: --max-position-embeddings >= --seq-length)
        shape = replace(shape, max_positions=raw.seq_len)
    memory = raw.memory
    if memory.recipe is None:
        memory = memory.model_copy(update={"recipe": RECIPE_OF_WORKLOAD[raw.workload.kind]})
    cluster = Cluster(raw.cluster.nodes, raw.cluster.gpus_per_node, raw.cluster.resolved_gpu())
    space = raw.space.values()
    from sweeper.spec_checks import check_layout_count

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
        memory=memory,
        launcher=raw.launcher,
        results_dir=Path(raw.results_dir),
        source=source,
        workload=raw.workload,
    )
    _check_usable(sweep)
    return sweep


def _check_usable(sweep: Sweep) -> None:
    """A tp or pp value that no layout can use is a typo, not a search dimension: say so.

    The rules are the plan's own (`sweeper.layout.unusable`), written once.
    """
    from sweeper.layout import unusable

    for knob in ("tp", "pp"):
        for v in sweep.space[knob]:
            why = unusable(knob, v, sweep)
            if knob == "pp" and v > sweep.model.layers:
                why.append(f"it exceeds layers={sweep.model.layers}")
            if why:
                raise SpecError(f"space.{knob}: value {v} can never be used: {'; '.join(why)}")
    gbs = sweep.global_batch_size
    for v in sweep.space["micro_batch_size"]:
        if v > gbs:
            raise SpecError(f"space.micro_batch_size: value {v} exceeds global_batch_size={gbs}")


def parse_sweep(text: str | bytes, *, source: str = "<sweep file>") -> Sweep:
    """Validate the text of a sweep file; every problem raises SpecError naming the field."""
    if isinstance(text, bytes):
        if len(text) > MAX_SPEC_BYTES:
            raise SpecError(f"{source}: file is {len(text)} bytes; a sweep file must be under {MAX_SPEC_BYTES}")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SpecError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    data = _load_yaml(text, source)
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping of fields (name, model, ...), got {type(data).__name__}")
    try:
        raw = SweepFile.model_validate(data)
    except ValidationError as e:
        raise SpecError(f"{source}: {format_validation_error(e)}") from None
    try:
        return build_sweep(raw, source=Path(source) if source != "<sweep file>" else None)
    except SpecError as e:
        raise SpecError(f"{source}: {e}") from None


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases, so an anchor 'bomb' cannot expand into gigabytes."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.MarkedYAMLError(
                "while reading the sweep file", None, "aliases (*name) are not supported", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        # a key given twice would silently keep the last value: `seq_len: 64` ... `seq_len: 128`
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = key_node.value
            if key in seen:
                raise yaml.MarkedYAMLError(
                    "while reading the sweep file",
                    None,
                    f"duplicate key {key!r} (line {key_node.start_mark.line + 1}; first on line {seen[key] + 1})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str, source: str) -> Any:
    """The YAML document; a syntax error is one line naming the file, line and column (PyYAML's
    own text names `<unicode string>` and spans several lines)."""
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = e.problem or e.context or "not valid YAML"
        if e.problem and e.context and e.context_mark:  # e.g. "while parsing a flow sequence" and where it began
            what += f" ({e.context} from line {e.context_mark.line + 1})"
        raise SpecError(f"{source}: invalid YAML{where}: {' '.join(what.split())}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{source}: invalid YAML: {' '.join(str(e).split())}") from None


_UNION_BRANCH_MISMATCH = {"string_type", "model_type", "dict_type", "model_attributes_type", "list_type"}


def format_validation_error(e: ValidationError) -> str:
    """One line per problem: the dotted field path, then what is wrong and what is allowed."""
    entries = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"] if not _is_union_tag(p))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field; allowed: {', '.join(_allowed_fields(err['loc']))}"
        elif err["type"] == "missing":
            msg = "required field is missing"
        entries.append((loc, err["type"], msg))
    # A union (e.g. `model: preset | mapping`) reports a type mismatch for the branch the user
    # did not mean; drop it when the other branch has something specific to say.
    specific = [loc for loc, kind, _ in entries if kind not in _UNION_BRANCH_MISMATCH]
    lines = []
    for loc, kind, msg in entries:
        if kind in _UNION_BRANCH_MISMATCH and any(o == loc or o.startswith(loc + ".") for o in specific):
            continue
        if not loc or msg.startswith((loc + ".", loc + ":")):
            lines.append(msg)
        else:
            lines.append(f"{loc}: {msg}")
    return "; ".join(dict.fromkeys(lines))


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (
        part in {"str", "int", "bool", "float"} or "[" in part or part in {"ModelSpec", "GPUSpec"}
    )


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = SweepFile
    for part in loc[:-1]:
        if _is_union_tag(part):
            continue
        info = model.model_fields.get(str(part))
        if info is None:
            break
        inner = _pydantic_class(info.annotation)
        if inner is None:
            break
        model = inner
    return list(model.model_fields)


def _pydantic_class(annotation: Any) -> type[BaseModel] | None:
    candidates = getattr(annotation, "__args__", (annotation,))
    for c in candidates:
        if isinstance(c, type) and issubclass(c, BaseModel):
            return c
    return None


def load_sweep(path_or_name: str | Path) -> Sweep:
    """Read a sweep file by path, or by bare name in the current directory, then among the shipped spaces."""
    path = find_sweep_file(path_or_name)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror}") from None
    return parse_sweep(data, source=str(path))


def shipped_spaces_dir() -> Path:
    return Path(__file__).parent / "data" / "search_spaces"


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
