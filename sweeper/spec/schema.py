"""The sweep file's schema: the pydantic models that validate it, and the `Sweep` it becomes.

Reading the file (YAML, strictness, finding it) is `sweeper.spec.loader`; turning pydantic's
errors into one line per field is `sweeper.spec.messages`.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from sweeper.knobs import KNOBS
from sweeper.spec.checks import check_workload
from sweeper.spec.goal import GoalSpec, node_counts
from sweeper.spec.hardware import GPU, known_gpus, lookup_gpu
from sweeper.spec.memory_options import OPTION_TYPES, BuiltinMemory, MemoryOptions
from sweeper.spec.models import PRESETS, ModelShape
from sweeper.spec.traits import BUILTIN_KIND, TRAINER_KINDS, default_recipe

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


MAX_LAYOUTS = 1 << 20  # the plan holds every layout in memory (about 1.5 kB each): cap it before it is made
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


class _Strict(BaseModel):
    # strict: "64" and 64.0 are not integers, 1 is not a bool; a typo should not change a sweep quietly
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
    experts: int = Field(default=0, ge=0, le=100_000, description="routed experts per MoE block (0: a dense model)")
    experts_per_token: int | None = Field(
        default=None, ge=1, le=100_000, description="experts the router picks per token (top-k)"
    )
    moe_ffn: int | None = Field(default=None, ge=1, le=10_000_000, description="one expert's MLP width; default ffn")
    shared_experts: int = Field(default=0, ge=0, le=1_000, description="experts every token passes through")
    dense_layers: int = Field(default=0, ge=0, le=100_000, description="leading blocks with a dense MLP of width ffn")
    router: Literal["softmax", "sigmoid"] = Field(
        default="softmax", description="the router's scores: softmax (Mixtral, Qwen3) or sigmoid (DeepSeek-V3)"
    )
    attention_bias: bool = Field(default=False, description="biases on the q, k, v and o projections (GPT-OSS)")
    mlp_bias: bool = Field(default=False, description="biases on a SwiGLU MLP's, the experts' and the router's layers")
    attention_sinks: bool = Field(default=False, description="a learned sink logit per head and block (GPT-OSS)")
    qkv_bias: bool = Field(default=False, description="biases on the q, k and v projections only (Qwen2)")

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
        self._experts_fit()
        return self

    def _experts_fit(self) -> None:
        moe_only = {"experts_per_token": self.experts_per_token, "moe_ffn": self.moe_ffn}
        moe_only |= {"shared_experts": self.shared_experts or None, "dense_layers": self.dense_layers or None}
        if not self.experts:
            given = [k for k, v in moe_only.items() if v is not None]
            if given:
                raise ValueError(f"model.{given[0]}: only a mixture of experts has it; set model.experts")
            return
        if self.experts < 2:
            raise ValueError(f"model.experts: {self.experts}; a mixture of experts has at least 2 (0: dense)")
        if self.experts_per_token is None:
            raise ValueError("model.experts_per_token: a mixture of experts needs its top-k (1 to experts)")
        if self.experts_per_token > self.experts:
            raise ValueError(
                f"model.experts_per_token: {self.experts_per_token} exceeds experts={self.experts}; "
                "allowed: 1 to experts"
            )
        if self.dense_layers >= self.layers:
            raise ValueError(f"model.dense_layers: {self.dense_layers}; allowed: 0 to layers-1 = {self.layers - 1}")

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
            experts=self.experts,
            experts_per_token=self.experts_per_token or 0,
            moe_ffn=self.moe_ffn or 0,
            shared_experts=self.shared_experts,
            dense_layers=self.dense_layers,
            router=self.router,
            attention_bias=self.attention_bias,
            mlp_bias=self.mlp_bias,
            attention_sinks=self.attention_sinks,
            qkv_bias=self.qkv_bias,
        )


class HFConfigSpec(_Strict):
    """A Hugging Face config.json as the model (`sweeper.spec.hf_config` lists the architectures read)."""

    hf_config: str = Field(
        min_length=1,
        max_length=4096,
        description="a config.json (Llama, Mistral, Qwen2/3, Mixtral, Qwen MoE); relative to the sweep file's folder",
    )


def _model_kind(v: Any) -> str | None:
    """Which form of `model:` a value is: a preset name, a shape, or a config.json (None: none of them)."""
    if isinstance(v, str):
        return "str"
    if isinstance(v, HFConfigSpec) or (isinstance(v, dict) and "hf_config" in v):
        return "HFConfigSpec"
    return "ModelSpec" if isinstance(v, (dict, ModelSpec)) else None


MODEL_FORMS = "a preset name, a mapping of the shape (layers, hidden, heads, ffn, vocab, ...), or {hf_config: path}"
ModelField = Annotated[
    Union[  # noqa: UP007 - a tagged union of the three forms
        Annotated[str, Tag("str")], Annotated[ModelSpec, Tag("ModelSpec")], Annotated[HFConfigSpec, Tag("HFConfigSpec")]
    ],
    Discriminator(_model_kind, custom_error_type="model_form", custom_error_message=f"must be {MODEL_FORMS}"),
]


class GPUSpec(_Strict):
    """A GPU that is not in the table: its memory and dense bf16 peak."""

    name: str = "custom-gpu"
    memory_gib: float = Field(gt=0, le=100_000)
    peak_tflops: float = Field(gt=0, le=1_000_000)
    fp8_tflops: float | None = Field(default=None, gt=0)

    def gpu(self) -> GPU:
        return GPU(self.name, self.memory_gib, self.peak_tflops, None, self.fp8_tflops, "user-defined")


class ClusterSpec(_Strict):
    nodes: int | list[int] = Field(description="nodes of the allocation, or a list of node counts to compare")
    gpus_per_node: int = Field(ge=1, le=1024)
    gpu: str | GPUSpec
    intra_node_gbps: float | None = Field(default=None, gt=0, le=100_000, description="GB/s per GPU within a node")
    inter_node_gbps: float | None = Field(default=None, gt=0, le=100_000, description="GB/s per GPU between nodes")
    profile: str | None = Field(
        default=None,
        min_length=1,
        description="a measured profile (`sweep profile`) the step-time model prices from; default: the "
        "user's cached profile of this GPU, if any",
    )
    link: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="the link between the nodes as `sweep profile --nodes N` records it (e.g. 'tbf 1Gbit', "
        "the local two-node cluster's shaping); a measured profile of another link is refused",
    )

    @field_validator("nodes", mode="before")
    @classmethod
    def _node_counts(cls, v: Any) -> Any:
        return node_counts(v)

    @property
    def sizes(self) -> tuple[int, ...]:
        """The node counts, smallest first (one for a scalar `nodes`)."""
        return tuple(self.nodes) if isinstance(self.nodes, list) else (self.nodes,)

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | GPUSpec) -> str | GPUSpec:
        if isinstance(v, str) and lookup_gpu(v) is None:
            raise ValueError(
                f"unknown GPU {v!r}; known: {known_gpus()} (or give a mapping {{memory_gib, peak_tflops}})"
            )
        return v

    def resolved_gpu(self) -> GPU:
        """The table entry (or the user's card), with the link bandwidths the file overrides."""
        gpu = self.gpu.gpu() if isinstance(self.gpu, GPUSpec) else lookup_gpu(self.gpu)
        assert gpu is not None  # checked by the validator
        if self.intra_node_gbps is not None:
            gpu = replace(gpu, intra_gbps=self.intra_node_gbps)
        if self.inter_node_gbps is not None:
            gpu = replace(gpu, inter_gbps=self.inter_node_gbps)
        return gpu


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


MAX_GPU_HOURS = 1e9


class SearchSettings(_Strict):
    max_trials: int = Field(default=40, ge=1, le=1_000_000)
    max_gpu_hours: float | None = Field(
        default=None,
        description="never start a trial that would take the sweep's GPU-hours past this (default: no limit)",
    )
    parallel: int = Field(default=1, ge=1, le=10_000)
    sampler: Literal["auto", "grid", "random", "tpe", "gp"] = "auto"
    seed: int = Field(default=0, ge=0)
    storage: str | None = Field(default=None, description="an Optuna storage URL; default SQLite beside the results")
    seed_trials: int | None = Field(
        default=None, ge=0, le=10_000, description="auto: first trials on the best-predicted layouts (default: none)"
    )
    stop_margin: float | None = Field(
        default=None, ge=0, le=10, description="stop early when no untried layout is predicted to beat the best by this"
    )
    learned_profile: bool | None = Field(
        default=None,
        description="start from what earlier sweeps on this cluster, GPU and trainer taught, and add what this one "
        "teaches (default: no; on recorded sweeps it did not shorten the search: docs/profiles.md)",
    )

    @field_validator("max_gpu_hours", mode="before")
    @classmethod
    def _gpu_hours(cls, v: Any) -> Any:
        """One line for any bad value: a number of GPU-hours above 0 (a bool, text, NaN or infinity is none)."""
        if v is None:
            return v
        number = isinstance(v, (int, float)) and not isinstance(v, bool)
        if not number or not 0 < v <= MAX_GPU_HOURS:  # NaN fails both comparisons
            raise ValueError(
                f"search.max_gpu_hours: {v!r} not allowed; allowed: a number of GPU-hours above 0, "
                f"at most {MAX_GPU_HOURS:g}"
            )
        return float(v)


if TYPE_CHECKING:
    MemorySettings = MemoryOptions
else:
    # `memory:` is one recipe's options, told apart by `recipe` (filled in from workload.kind by
    # `SweepFile` when left out); each recipe's class lists what it accepts (sweeper.spec.memory_options)
    MemorySettings = Annotated[Union[OPTION_TYPES], Field(discriminator="recipe")]  # noqa: UP007


class WorkloadSpec(_Strict):
    """What a trial runs: the built-in trainer, or an external trainer's command."""

    kind: str = Field(default="builtin", description=f"the trainer: {', '.join(TRAINER_KINDS)}")
    command: str = Field(
        default="",
        max_length=10_000,
        description="argv template; {flags} = the layout as the trainer's flags, {tp} ... = values",
    )
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    cwd: str | None = None

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v not in TRAINER_KINDS:
            raise ValueError(f"workload.kind: {v!r} not allowed; allowed: {', '.join(TRAINER_KINDS)}")
        return v

    @model_validator(mode="after")
    def _command_needed(self) -> WorkloadSpec:
        if self.kind != BUILTIN_KIND and not self.command.strip():  # every other trainer runs a command
            raise ValueError(f"workload.command is required for kind {self.kind!r} (e.g. 'torchrun ... {{flags}}')")
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
    cp: list[int] | None = _space_field("cp")
    ep: list[int] | None = _space_field("ep")
    etp: list[int] | None = _space_field("etp")

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
    model: ModelField
    seq_len: int = Field(ge=1, le=10_000_000)
    global_batch_size: int = Field(ge=1, le=100_000_000, description="sequences per optimizer step")
    cluster: ClusterSpec
    space: SpaceSpec = SpaceSpec()
    trial: TrialSettings = TrialSettings()
    search: SearchSettings = SearchSettings()
    memory: MemorySettings = BuiltinMemory()
    launcher: str | dict[str, Any] = "local"
    workload: WorkloadSpec = WorkloadSpec()
    results_dir: str = "results"
    goal: GoalSpec | None = None

    @model_validator(mode="before")
    @classmethod
    def _memory_recipe_from_workload(cls, data: Any) -> Any:
        # memory.recipe left out: the workload's trainer's, so its options are the ones accepted
        if not isinstance(data, dict):
            return data
        memory = data.get("memory", {})
        if not isinstance(memory, dict) or memory.get("recipe") is not None:
            return data
        workload = data.get("workload")
        kind = workload.get("kind", "builtin") if isinstance(workload, dict) else "builtin"
        return {**data, "memory": {**memory, "recipe": default_recipe(kind)}}

    @field_validator("name")
    @classmethod
    def _safe_name(cls, v: str) -> str:
        if not SAFE_NAME.match(v):
            raise ValueError(f"name must be letters, digits, '_', '.', '-' (a folder name), but got {v!r}")
        return v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | ModelSpec | HFConfigSpec) -> str | ModelSpec | HFConfigSpec:
        if isinstance(v, str) and v.lower() not in PRESETS:
            import difflib

            close = difflib.get_close_matches(v.lower(), list(PRESETS), n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown model preset {v!r}{hint}; presets: {', '.join(PRESETS)} "
                "(or give a mapping of the shape, or {hf_config: path})"
            )
        return v

    @field_validator("launcher")
    @classmethod
    def _launcher_name(cls, v: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(v, str) and not SAFE_NAME.match(v):
            raise ValueError(f"launcher must be a profile name (letters, digits, '_', '.', '-'), but got {v!r}")
        if isinstance(v, dict) and not isinstance(v.get("kind"), str):
            raise ValueError("an inline launcher mapping needs a 'kind' (local, slurm, ...)")
        return v
