"""A machine profile: what `sweep profile` measured on one node, as a versioned YAML file. Pure.

The file holds the device and the software it was measured with, then tables of measured
seconds: GEMMs by shape (forward, and backward's two GEMMs), attention per kernel and shape,
memory-bound operations per element count (eager and compiled), one transformer block of the
built-in trainer at a tiny shape per knob value (its host overhead), and collectives by message
size. `sweeper.estimate.profiled` prices a layout from these tables (interpolated log-log over the size,
`sweeper.profiles.lookup`); the torch side that measures them is `sweeper.runtime.profiling`.

The top level's `schema:` and `kind:` say how to read the rest: `kind: measured` is this file;
`kind: learned` (what a finished sweep taught) is `sweeper.search.learned`'s. Both live in one
cache folder per user (`sweeper.profiles.cache`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, ValidationInfo, model_validator

from sweeper.errors import SweepError
from sweeper.files import FileRefused, atomic_write_text, parse_yaml, read_limited

SCHEMA = 1
MEASURED = "measured"
LEARNED = "learned"
KINDS = (MEASURED, LEARNED)
MAX_PROFILE_BYTES = 8 << 20  # a profile holds a few hundred rows; anything bigger is a mistake

GemmDtype = Literal["bf16", "fp8", "fp32"]
ElementwiseOp = Literal["rmsnorm", "layernorm", "rope", "swiglu", "gelu", "add", "cross_entropy", "adamw", "fp8_cast"]
ElementwiseMode = Literal["eager", "fused", "compiled"]
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all", "broadcast"]
Scope = Literal["intra", "inter"]
# what a measurement can say: an integer is an integer ("16", true or 16.0 are not), a time is
# positive and under 1e6 s (11 days: no kernel or collective of a step takes that), a count of
# rows, elements or bytes is positive and below 1e15
Count = Annotated[int, Strict(), Field(ge=1, lt=10**15)]
Seconds = Annotated[float, Strict(), Field(gt=0, lt=1e6)]
MaybeSeconds = Annotated[float, Strict(), Field(ge=0, lt=1e6)]  # a part that may do nothing (adamw's backward)
# a name a measurement writes (a device, a host, a version, a knob): no run writes a longer one, and a
# file's longer text would print as a page on every dry run; a path, at most the system's PATH_MAX
Name = Annotated[str, Field(max_length=200)]
PathText = Annotated[str, Field(max_length=4096)]


class ProfileError(SweepError):
    """A profile file that cannot be read: malformed, another schema or kind, another GPU."""


class _Row(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Versions(_Row):
    """What the numbers were measured with (None: not there, e.g. CUDA on a CPU node)."""

    python: Name
    torch: Name
    cuda: Name | None = None
    nccl: Name | None = None
    driver: Name | None = None
    backend: Name = Field(description="the collectives' backend: nccl or gloo")


class GemmPoint(_Row):
    """C[m, n] = A[m, k] B[k, n]: seconds of the forward GEMM and of backward's two (dgrad, wgrad)."""

    dtype: GemmDtype
    m: Count
    n: Count
    k: Count
    fwd_s: Seconds
    bwd_s: Seconds


class AttentionPoint(_Row):
    """One causal attention call of `kernel` on (batch, heads, seq, head_dim) queries: forward and backward."""

    kernel: Name
    batch: Count
    heads: Count
    kv_heads: Count
    head_dim: Count
    seq: Count
    fwd_s: Seconds
    bwd_s: Seconds


class ElementwisePoint(_Row):
    """A memory-bound operation over `elements` elements (adamw: parameters; cross_entropy: logits)."""

    op: ElementwiseOp
    mode: ElementwiseMode
    elements: Count
    fwd_s: MaybeSeconds
    bwd_s: MaybeSeconds


# the data-parallel wrappers a profile times the tiny model under (`BlockPoint` knob; its value: the
# model's blocks): none, DDP on a micro-batch that reduces, FSDP2's replicate on one that does not and
# on one that does, and FSDP, each on a mesh of one rank (their hooks and copies, not their collectives)
DP_WRAPPERS = ("model", "ddp", "replicate", "replicate_sync", "fsdp")
DP_WRAPPER_DEPTHS = (1, 3)  # two depths: the wrappers' cost per block apart from their cost per model


class BlockPoint(_Row):
    """One transformer block of the built-in trainer, forward and backward, at a tiny shape where the
    host's overhead (launches, Python, autograd) is all there is: `knob` set to `value`, the others at
    the profile's base values (`Profile.block_base`). A knob of `DP_WRAPPERS`: the tiny model of
    `value` blocks under that wrapper."""

    knob: Name
    value: Name
    rows: Count
    seconds: Seconds


def traffic(op: str, ranks: np.ndarray) -> np.ndarray:
    """Bytes on the bus per byte of the buffer (nccl-tests' busbw factors): an all-reduce moves
    2(n-1)/n of it, an all-gather, reduce-scatter or all-to-all (n-1)/n, a send or a broadcast all of it."""
    n = np.maximum(ranks, 1.0)
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("send_recv", "broadcast"):
        return np.ones_like(n)
    return (n - 1) / n


# the slowest collective a profile may hold: a bus that moves a buffer at under 1 MB/s (below a
# 10 Mbit/s line) after waiting over a second for its first byte is no interconnect a job trains on;
# a reading below it (a bandwidth of 1e-300) prices every layout that communicates at nothing
BUS_FLOOR_BYTES_S = 1e6
LATENCY_CEILING_S = 1.0


class CollectivePoint(_Row):
    """One collective over `ranks` processes (`scope`: within a node or across two) of a `bytes` buffer;
    across nodes, `per_node` of each node's ranks take part (they share the node's link), and
    `algorithm` is how the backend ran it (gloo: a flat ring over the ranks in order). `seconds` and
    the time `busbw_gbps` implies stay above the physical floor (BUS_FLOOR_BYTES_S, LATENCY_CEILING_S)."""

    op: CollectiveOp
    scope: Scope
    ranks: Annotated[int, Strict(), Field(ge=2, le=1_000_000)]
    per_node: Annotated[int, Strict(), Field(ge=1, le=100_000)] | None = None  # ranks of each node (across nodes)
    algorithm: Annotated[str, Field(max_length=64)] | None = None  # as the backend ran it (gloo: ring, pairwise, pair)
    bytes: Count
    seconds: Seconds
    busbw_gbps: Annotated[float, Strict(), Field(gt=0, lt=1e6)]  # GB/s: no bus moves a petabyte a second

    @model_validator(mode="after")
    def _above_the_floor(self) -> CollectivePoint:
        on_bus = float(traffic(self.op, np.array(float(self.ranks)))) * self.bytes
        slowest = LATENCY_CEILING_S + on_bus / BUS_FLOOR_BYTES_S
        implied = on_bus / (self.busbw_gbps * 1e9)
        for what, s in (("seconds", self.seconds), (f"busbw_gbps {self.busbw_gbps:.3g} GB/s", implied)):
            if s > slowest:
                raise ValueError(
                    f"{what}: {self.op} of {self.bytes:,} bytes over {self.ranks} ranks in {s:.3g} s, slower than "
                    f"any interconnect; allowed: at most {LATENCY_CEILING_S:g} s of latency, then "
                    f"{BUS_FLOOR_BYTES_S / 1e6:g} MB/s or faster ({slowest:.3g} s)"
                )
        return self


HOST_STEP_BOUNDS = (0.25, 4.0)  # a whole step against its priced parts: beyond these, not the host's doing


class ReferenceStep(_Row):
    """Real steps of the built-in trainer on the profile's ranks (`layout`, the 10-step protocol's
    median) at one depth (`passes`: the block passes each rank runs a step, blocks x micro-batches),
    beside what the rest of the profile prices them at: on ranks that share cores, a whole step takes
    longer than its separately measured parts add up to, by `gap_s`."""

    layout: Name
    passes: Annotated[int, Strict(), Field(ge=1, le=1_000_000)]
    measured_s: Seconds
    predicted_s: Seconds

    @model_validator(mode="after")
    def _the_hosts_doing(self) -> ReferenceStep:
        low, high = HOST_STEP_BOUNDS
        ratio = self.measured_s / self.predicted_s
        if not low <= ratio <= high:
            raise ValueError(
                f"measured {self.measured_s:.4g} s against {self.predicted_s:.4g} s priced: a ratio of "
                f"{ratio:.3g}; allowed: {low} to {high}"
            )
        return self

    @property
    def gap_s(self) -> float:
        """What the steps took beyond their parts (0 where they took less than priced)."""
        return max(self.measured_s - self.predicted_s, 0.0)


def host_costs(steps: tuple[ReferenceStep, ...]) -> tuple[float, float]:
    """(seconds a step, seconds a block pass) that whole steps take beyond their parts, from the
    reference steps: at one depth all of it a step; at two or more, the line through their gaps
    against their block passes (the waits grow with the collectives and hooks a pass brings), neither
    part below zero."""
    if not steps:
        return 0.0, 0.0
    passes = [float(s.passes) for s in steps]
    gaps = [s.gap_s for s in steps]
    if len(set(passes)) < 2:
        return sum(gaps) / len(gaps), 0.0
    mean_p, mean_g = sum(passes) / len(passes), sum(gaps) / len(gaps)
    slope = sum((p - mean_p) * (g - mean_g) for p, g in zip(passes, gaps, strict=True)) / sum(
        (p - mean_p) ** 2 for p in passes
    )
    if slope <= 0.0:  # deeper steps waited no longer: a cost of the step alone
        return mean_g, 0.0
    intercept = mean_g - slope * mean_p
    if intercept < 0.0:  # through the origin: every second of it a pass's
        return 0.0, sum(p * g for p, g in zip(passes, gaps, strict=True)) / sum(p * p for p in passes)
    return intercept, slope


# rows of one shape measured twice agree within noise (an H200's repeated casts: 1 %); beyond this
# factor they contradict each other, and which one prices the shape would be a guess
REPEAT_AGREEMENT = 2.0


def _merged(rows: tuple[Any, ...], key: Any, times: tuple[str, ...], table: str | None) -> list[Any]:
    """`rows` sorted by `key`, those of one key merged: each of `times` the geometric mean of the
    rows' (None where none gives one), the rest the first's in a fixed order (the whole row's text).
    With `table` named (a file's), rows of one key whose times differ by more than REPEAT_AGREEMENT
    are refused (ValueError); a measurement's (two shapes of one size) are merged whatever they differ."""
    import math

    groups: dict[Any, list[Any]] = {}
    for r in sorted(rows, key=lambda r: (key(r), repr(r))):
        groups.setdefault(key(r), []).append(r)
    out = []
    for same in groups.values():
        if len(same) == 1:
            out.append(same[0])
            continue
        merged = {}
        for f in times:
            given = [float(getattr(r, f)) for r in same if getattr(r, f) is not None]
            if table is not None and given and max(given) > REPEAT_AGREEMENT * min(given):
                raise ValueError(
                    f"{table}: {len(same)} rows of one shape {key(same[0])} disagree: {f} from {min(given):.3g} "
                    f"to {max(given):.3g}, over {REPEAT_AGREEMENT:g}x apart; keep one row per shape"
                )
            # the geometric mean: 0 where one is 0 (an optimizer step with nothing to do backward)
            mean = 0.0 if any(v <= 0 for v in given) else math.exp(sum(math.log(v) for v in given) / len(given))
            merged[f] = mean if given else None
        out.append(same[0].model_copy(update=merged))
    return out


class Profile(_Row):
    """A measured profile of one node (see the module's docstring)."""

    schema_: Literal[1] = Field(alias="schema")
    kind: Literal["measured"] = "measured"
    gpu: Name = Field(description="the GPU table's key of the device (sweeper.spec.hardware.GPUS)")
    device: Name = Field(description="the device's own name (torch.cuda.get_device_name, or the CPU's)")
    host: Name
    measured_at: Name = Field(description="ISO 8601, UTC")
    versions: Versions
    shapes_from: PathText = Field(description="the sweep file whose shapes were measured, or 'default'")
    processes: Annotated[int, Strict(), Field(ge=1, le=100_000)] = Field(
        description="processes that shared the cores while the compute was measured"
    )
    nodes: Annotated[int, Strict(), Field(ge=1, le=100_000)] = Field(
        default=1, description="nodes the measuring job spanned (collectives across them)"
    )
    shared_host: Annotated[bool, Strict()] = Field(
        default=False, description="the nodes were namespaces of one machine: their ranks shared its cores"
    )
    link: Name | None = Field(default=None, description="the link between the nodes, as measured or shaped")
    cpus: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] = Field(description="the node's CPU cores")
    threads: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] = Field(description="threads per process (CPU)")
    launch_s: MaybeSeconds = Field(description="host time of one small eager op, forward and backward")
    block_base: Annotated[dict[Name, Name], Field(max_length=64)] = Field(default_factory=dict)
    gemm: tuple[GemmPoint, ...] = ()
    attention: tuple[AttentionPoint, ...] = ()
    elementwise: tuple[ElementwisePoint, ...] = ()
    block: tuple[BlockPoint, ...] = ()
    collectives: tuple[CollectivePoint, ...] = ()
    reference_steps: tuple[ReferenceStep, ...] = ()

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, populate_by_name=True)

    @model_validator(mode="after")
    def _sorted(self, info: ValidationInfo) -> Profile:
        """Every table in one order, whatever the file's, and rows that repeat one shape merged into
        one: each of its times (and a collective's bandwidth) the geometric mean of theirs, as the
        curves average repeated sizes. In a file (`load_profile`), rows of one shape that disagree
        beyond REPEAT_AGREEMENT are refused: `sweep profile` writes each shape once. A reader
        that interpolates over a table (np.interp over unsorted or repeated sizes) or indexes it by
        shape must not answer by the rows' order."""
        strict = bool(info.context and info.context.get("from_file"))
        tables: dict[str, list[Any]] = {
            "gemm": _merged(
                self.gemm,
                lambda g: (g.dtype, g.m * g.n * g.k, g.m, g.n, g.k),
                ("fwd_s", "bwd_s"),
                "gemm" if strict else None,
            ),
            "attention": _merged(
                self.attention,
                lambda a: (a.kernel, a.seq, a.batch, a.heads, a.kv_heads, a.head_dim),
                ("fwd_s", "bwd_s"),
                "attention" if strict else None,
            ),
            "elementwise": _merged(
                self.elementwise,
                lambda e: (e.op, e.mode, e.elements),
                ("fwd_s", "bwd_s"),
                "elementwise" if strict else None,
            ),
            "block": _merged(
                self.block, lambda b: (b.knob, b.value, b.rows), ("seconds",), "block" if strict else None
            ),
            "collectives": _merged(
                self.collectives,
                lambda c: (c.op, c.scope, c.ranks, c.per_node or 0, c.bytes),
                ("seconds", "busbw_gbps"),
                "collectives" if strict else None,
            ),
        }
        for name, rows in tables.items():
            object.__setattr__(self, name, tuple(rows))
        return self

    @model_validator(mode="after")
    def _one_measurement(self, info: ValidationInfo) -> Profile:
        """In a file: its numbers as one run of `sweep profile` writes them, or one line naming the
        field that contradicts the rest (an edit that makes a 2-rank profile claim 64 processes
        multiplies every CPU layout's predicted MFU)."""
        if info.context and info.context.get("from_file"):
            wrong = self._contradiction()
            if wrong is not None:
                raise ValueError(wrong)
        return self

    def _contradiction(self) -> str | None:
        """What `sweeper.runtime.profile_run` never writes: collectives within a node over other than
        all its ranks, or across nodes over other than `per_node` of each; `processes` other than the
        ranks that shared a node's cores (every node's, on namespaces of one machine); a CPU rank's
        `threads` other than its share of the cores; reference steps where ranks never outnumbered them."""
        within = sorted({c.ranks for c in self.collectives if c.scope == "intra"})
        across = [c for c in self.collectives if c.scope == "inter"]
        if len(within) > 1:
            return f"collectives: within a node over {within} ranks; a profile measures them over all its ranks, once"
        if (across or self.shared_host) and self.nodes < 2:
            return "nodes: 1, but collectives across nodes or shared_host: true; allowed: nodes of 2 or more"
        for c in across:
            if c.ranks != self.nodes * (c.per_node or c.ranks // self.nodes):
                return (
                    f"collectives: {c.op} across {self.nodes} nodes over {c.ranks} ranks with per_node {c.per_node}; "
                    f"allowed: {self.nodes} x per_node ranks"
                )
        node = within[0] if within else max((c.per_node or c.ranks // self.nodes for c in across), default=None)
        expected = None if node is None else node * (self.nodes if self.shared_host else 1)
        if expected is not None and self.processes != expected:
            where = f"{node} ranks a node{' of a shared host' if self.shared_host else ''}"
            return f"processes: {self.processes}, but its collectives ran on {where}; allowed: {expected}"
        if self.gpu == "cpu" and self.threads != max(1, self.cpus // self.processes):
            return (
                f"threads: {self.threads} per process, but {self.processes} processes share {self.cpus} cores; "
                f"allowed: {max(1, self.cpus // self.processes)}"
            )
        if self.reference_steps and not (self.gpu == "cpu" and self.processes > self.cpus):
            here = f"{self.processes} processes on {self.cpus} cores" if self.gpu == "cpu" else f"gpu {self.gpu}"
            return f"reference_steps: measured only on CPU ranks that outnumber the cores, here {here}"
        return None

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def save_profile(profile: Profile, path: Path) -> None:
    """Write the profile as YAML, atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, yaml.safe_dump(profile.to_dict(), sort_keys=False, width=120))


def read_header(path: Path) -> dict[str, Any]:
    """The file's YAML mapping after the checks every kind shares: readable, a mapping, `schema: 1`,
    a known `kind:`. Each failure is one ProfileError line naming the field."""
    try:
        raw = parse_yaml(read_limited(path, max_bytes=MAX_PROFILE_BYTES), path)
    except FileRefused as e:
        raise ProfileError(str(e)) from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: a profile is a mapping (schema, kind, gpu, ...), got {type(raw).__name__}")
    if raw.get("schema") != SCHEMA:
        raise ProfileError(f"{path}: schema: {raw.get('schema')!r} is not readable here; allowed: {SCHEMA}")
    kind = raw.get("kind", MEASURED)
    if kind not in KINDS:
        raise ProfileError(f"{path}: kind: {kind!r} unknown; allowed: {', '.join(KINDS)}")
    return raw


def same_link(a: str, b: str) -> bool:
    """Two descriptions of a link name the same one: case and spacing aside ('tbf 1Gbit' = 'TBF  1gbit')."""
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def load_profile(path: Path, *, gpu: str | None = None, link: str | None = None) -> Profile:
    """A measured profile from `path`; `gpu` (a GPU table key) refuses one measured on another card,
    `link` (the sweep's `cluster.link`) one whose collectives crossed another link between nodes."""
    raw = read_header(path)
    if raw.get("kind", MEASURED) != MEASURED:
        raise ProfileError(f"{path}: kind: {raw['kind']} is not a measured profile; allowed here: {MEASURED}")
    try:
        profile = Profile.model_validate(raw, context={"from_file": True})
    except ValidationError as e:
        raise ProfileError(f"{path}: {_first_error(e)}") from None
    if gpu is not None and profile.gpu != gpu:
        raise ProfileError(
            f"{path}: gpu: {profile.gpu} was measured on {profile.device}; this sweep's cluster has gpu {gpu}"
        )
    if link is not None and profile.link is not None and not same_link(profile.link, link):
        raise ProfileError(
            f"{path}: link: measured across '{profile.link}'; this sweep's cluster.link is '{link}' "
            f"(measure this link with `sweep profile --nodes {profile.nodes}`, or name the profile's)"
        )
    return profile


def _first_error(e: ValidationError) -> str:
    """pydantic's first problem as `field.path: what is wrong` (one line; the count of the rest)."""
    errors = e.errors()
    err = errors[0]
    loc = ".".join(str(p) for p in err["loc"]) or "profile"
    msg = "required field is missing" if err["type"] == "missing" else err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "unknown field"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return f"{loc}: {msg}{more}"
