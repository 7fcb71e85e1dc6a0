"""Learned profiles: what the finished sweeps on one (cluster, GPU, trainer) taught, kept for the next sweep there.

One YAML file per key under `<cache>/sweep/profiles/learned/` (`${XDG_CACHE_HOME:-~/.cache}`):

    schema: 1
    kind: learned
    cluster: 8xa100-80gb            # the SLURM partition, or GPUs per node x GPU
    gpu: a100-80gb
    trainer: builtin
    sweeps:                         # the most recent MAX_SWEEPS, each with what it alone taught
    - id: 3f2a...                   # sweeper.results.identity.sweep_identity: a rerun replaces its own entry
      name: llama13b_2k
      model: llama-13b
      nodes: 8
      date: '2025-06-01T12:00:00+00:00'
      host: gpu-login-1             # where `sweep run` ran, and its results folder: whose sweep it was
      results: /home/me/results/llama13b_2k
      trials: 14                    # finished trials
      measured: 12                  # of them with a step time
      calibration: {compute_scale: 1.21, comm_scale: 0.93, trials: 12}
      effects:                      # log(measured / calibrated model) of the layouts with the value
      - {knob: pp, value: 4, log_ratio: 1.34, trials: 3}
      memory: {act_scale: 0.91, offset_gib: 1.2, reserved_factor: 1.07, peaks: 6}

Each sweep keeps its own numbers (never the prior it started from, so no sweep counts twice), and
`prior` combines them, leaving out the sweep that asks (a resumed sweep does not learn from itself).
Numbers that depend on the model's size (step times, peaks in GiB) are not kept; what is kept is
relative to the model: its scales, each knob value's effect, the memory estimate's refit.

A file is read from elsewhere: each number must be one a measurement could give (`PLAUSIBLE`: an
effect within 10x either way, scales within the calibration's bounds, ...). One that is not is left
out, and said (`Lessons.refused`: the dry run, `sweep run` and `sweep profile show` print it); the
rest of the sweep's lessons stand.
"""

from __future__ import annotations

import fcntl
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sweeper.errors import SpecError
from sweeper.estimate.memfit import SCALE_BOUNDS as MEMORY_SCALE_BOUNDS
from sweeper.estimate.memfit import MemoryFit
from sweeper.estimate.step_time import Calibration
from sweeper.files import FileRefused, atomic_write_text, parse_yaml, read_limited
from sweeper.profiles.cache import cache_dir, check_cached
from sweeper.profiles.profile import LEARNED
from sweeper.search.prior import EFFECT_BOUND, EffectKey, LearnedEffect, Prior
from sweeper.spec.hardware import GIB
from sweeper.spec.sweep import Sweep

SCHEMA = 1
KIND = LEARNED
MAX_SWEEPS = 8  # the most recent sweeps kept per key: a cluster's software changes; old lessons go
# eight sweeps' lessons are tens of kilobytes; the strict YAML reader takes about 5 s a MiB, so this
# keeps a dry run that reads one within a few seconds (8 MiB, the measured profiles' limit, took 39 s)
MAX_LEARNED_BYTES = 256 << 10
CLOCK_SKEW = timedelta(days=1)  # a sweep's date is when it ran: beyond this in the future, not a date
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
# What a measurement can say (beyond, a number is refused as implausible): the throughput scales as
# `residual.calibrate` bounds them, the memory refit's activation scale as `memfit.refit` does, a
# fixed memory offset within the largest card's memory, reserved over allocated memory, and counts.
CALIBRATION_BOUNDS = (0.2, 5.0)  # residual.SCALE_BOUNDS (not imported: it loads scikit-learn)
MAX_OFFSET_GIB = 256.0
RESERVED_BOUNDS = (0.9, 3.0)
MAX_COUNT = 1_000_000


def learns(sweep: Sweep, *, measures_here: bool) -> bool:
    """Whether the sweep uses and updates its learned profile: only when its file says
    `search.learned_profile: true`. Off by default: replayed in sequence on one cluster's recorded
    sweeps (`benchmarks/search_transfer.py --recorded`, docs/profiles.md), it made as many searches
    longer as shorter. `measures_here`: whether the launcher measures the cluster (not a replay);
    kept for the dry run's reason."""
    del measures_here  # on or off by the file alone: a replay asked to learn learns
    return bool(sweep.search.learned_profile)


def learned_dir() -> Path:
    """`${XDG_CACHE_HOME:-~/.cache}/sweep/profiles/learned`, beside the measured profiles."""
    return cache_dir() / KIND


@dataclass(frozen=True)
class LearnedKey:
    """What a learned profile is about: the machine the trials ran on, its GPU and the trainer.

    Not the model, its size or the node count: what is learned is relative to the model's
    prediction (`sweeper.search.prior`), and a cluster is the same machine at 8 nodes or 16."""

    cluster: str
    gpu: str
    trainer: str

    @classmethod
    def of(cls, sweep: Sweep, cluster_name: str | None = None) -> LearnedKey:
        """The key of a sweep: `cluster_name` (the launcher's: a SLURM partition) names the machine
        where one is configured; else the node's make, GPUs per node x GPU (8xh100-sxm), stands for it."""
        gpu = sweep.cluster.gpu.name
        return cls(cluster_name or f"{sweep.cluster.gpus_per_node}x{gpu}", gpu, sweep.workload.kind)

    @property
    def slug(self) -> str:
        """The file's name (without .yaml): the three parts, each reduced to safe characters."""
        return "__".join(_UNSAFE.sub("-", p).strip("-") or "-" for p in (self.cluster, self.gpu, self.trainer))

    @property
    def path(self) -> Path:
        return learned_dir() / f"{self.slug}.yaml"

    def __str__(self) -> str:
        return f"cluster {self.cluster}, GPU {self.gpu}, trainer {self.trainer}"


@dataclass(frozen=True)
class MemoryLesson:
    """The memory estimate's refit from one sweep's measured peaks (`memfit.MemoryFit`)."""

    act_scale: float
    offset_gib: float
    reserved_factor: float | None
    peaks: int


@dataclass(frozen=True)
class Lessons:
    """What one sweep taught, on its own."""

    sweep_id: str
    name: str
    model: str
    nodes: int
    date: str  # ISO 8601, UTC: when it was last saved
    trials: int
    measured: int
    calibration: Calibration | None
    effects: dict[EffectKey, LearnedEffect]
    memory: MemoryLesson | None
    host: str | None = None  # where `sweep run` ran
    results: str | None = None  # its results folder
    refused: tuple[str, ...] = ()  # numbers of the file left out as implausible, each with why

    @property
    def origin(self) -> str:
        """The sweep, when it was saved and where it ran: what lets a user tell whether it was theirs."""
        where = f"on {self.host}" if self.host else "host not recorded"
        results = f", results {self.results}" if self.results else ""
        return f"{self.name} ({_when(self.date)}, {self.nodes} node(s), {where}{results})"


def _when(date: str) -> str:
    """An ISO 8601 date as 'YYYY-MM-DD HH:MM UTC' (as written, when it is not one)."""
    if len(date) >= 16 and date[10] == "T":
        return f"{date[:10]} {date[11:16]} UTC"
    return date


@dataclass(frozen=True)
class LearnedProfile:
    key: LearnedKey
    sweeps: tuple[Lessons, ...]
    path: Path | None = None

    def prior(self, *, exclude: str | None = None, nodes: int | None = None) -> Prior | None:
        """The lessons of every kept sweep but `exclude` (a sweep id) combined, or None when none is left.

        Scales: geometric mean weighted by measured layouts; effects: per knob value, the mean
        weighted by the layouts with that value, shrunk by how far the sweeps disagree on it
        (`_effects`); memory: weighted by peaks. With `nodes` (the asking sweep's node count), each
        sweep's layouts count by how near its node count is (`similarity`): the scales' split
        between compute and communication, and a knob's effect, change with the network a step spans."""
        kept = [s for s in self.sweeps if s.sweep_id != exclude]
        if not kept:
            return None
        near = [1.0 if nodes is None else similarity(s.nodes, nodes) for s in kept]
        return Prior(
            calibration=_calibration([s.calibration for s in kept], near),
            calibration_trials=round(sum(s.calibration.trials * w for s, w in zip(kept, near) if s.calibration)),
            effects=_effects([s.effects for s in kept], near),
            memory=_memory([s.memory for s in kept]),
            sources=tuple(s.name for s in kept),
            origins=tuple(s.origin for s in kept),
            refused=tuple(line for s in kept for line in s.refused),
        )


def nodes_of(sweep: Sweep) -> int:
    """The node count a sweep's lessons are weighed for: its own, or the middle of its several."""
    counts = sorted(sweep.node_counts)
    return counts[len(counts) // 2]


def similarity(learned_at: int, asked_at: int) -> float:
    """How much a sweep's lessons at `learned_at` nodes count for a sweep at `asked_at`: 1 at the same
    node count, halved per doubling between them (a lesson of 1 node says little of 64)."""
    return 0.5 ** abs(math.log2(max(learned_at, 1) / max(asked_at, 1)))


def _calibration(found: list[Calibration | None], near: list[float]) -> Calibration | None:
    cals = [(c, c.trials * w) for c, w in zip(found, near) if c is not None and c.trials > 0]
    n = sum(w for _, w in cals)
    if not cals or n <= 0:
        return None
    compute = math.exp(sum(w * math.log(c.compute_scale) for c, w in cals) / n)
    comm = math.exp(sum(w * math.log(c.comm_scale) for c, w in cals) / n)
    return Calibration(compute, comm, 0)


def _effects(found: list[dict[EffectKey, LearnedEffect]], near: list[float]) -> dict[EffectKey, LearnedEffect]:
    """Per knob value: the weighted mean of the sweeps' effects, times how far they agree (|sum of the
    weighted effects| / sum of their sizes: 1 when all point the same way, 0 when they cancel), so one
    sweep's lucky or unlucky run is not carried to the next model as a rule; its layouts counted by
    nearness (an effect of layouts at other node counts counts as fewer of them)."""
    out: dict[EffectKey, LearnedEffect] = {}
    keys = {key for effects in found for key in effects}
    for key in keys:
        items = [(effects[key], w) for effects, w in zip(found, near) if key in effects]
        weight = sum(e.trials * w for e, w in items)
        if weight <= 0:
            continue
        total = sum(e.trials * w * e.log_ratio for e, w in items)
        size = sum(e.trials * w * abs(e.log_ratio) for e, w in items)
        agree = abs(total) / size if size > 0 else 0.0
        out[key] = LearnedEffect(total / weight * agree, max(1, round(weight)), len(items))
    return out


def _memory(found: list[MemoryLesson | None]) -> MemoryFit | None:
    fits = [m for m in found if m is not None and m.peaks > 0]
    if not fits:
        return None
    n = sum(m.peaks for m in fits)
    factors = [(m.reserved_factor, m.peaks) for m in fits if m.reserved_factor]
    factor = sum(f * k for f, k in factors) / sum(k for _, k in factors) if factors else None
    return MemoryFit(
        act_scale=sum(m.act_scale * m.peaks for m in fits) / n,
        offset_bytes=sum(m.offset_gib * m.peaks for m in fits) / n * GIB,
        reserved_factor=factor,
        points=0,  # none of this sweep's own
    )


# ---- the file -----------------------------------------------------------------------------
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# The file's fields are typed and finite here; whether a number is one a measurement can say
# (EFFECT_BOUND, the scale and memory ranges, MAX_COUNT) is judged where it is used, so that an
# implausible number is refused and said, and the rest of the file still counts (`_plausible`).
class _CalibrationFile(_Strict):
    compute_scale: float
    comm_scale: float
    trials: int


class _EffectFile(_Strict):
    knob: str = Field(max_length=100)
    value: bool | int | str
    log_ratio: float
    trials: int


class _MemoryFile(_Strict):
    act_scale: float
    offset_gib: float
    reserved_factor: float | None = None
    peaks: int


class _SweepFile(_Strict):
    id: str = Field(min_length=1, max_length=200)
    name: str = Field(max_length=200)
    model: str = Field(max_length=200)
    nodes: int = Field(ge=1)
    date: str = Field(max_length=100)
    host: str | None = Field(default=None, max_length=300)

    @field_validator("date")
    @classmethod
    def _a_date(cls, v: str) -> str:
        return checked_date(v)

    results: str | None = Field(default=None, max_length=4096)
    trials: int = Field(ge=0)
    measured: int = Field(ge=0)
    calibration: _CalibrationFile | None = None
    effects: list[_EffectFile] = Field(default_factory=list)
    memory: _MemoryFile | None = None


class _ProfileFile(_Strict):
    schema_: Literal[1] = Field(alias="schema")
    kind: Literal["learned"]
    cluster: str = Field(min_length=1)
    gpu: str = Field(min_length=1)
    trainer: str = Field(min_length=1)
    sweeps: list[_SweepFile] = Field(default_factory=list, max_length=100)


def checked_date(text: str) -> str:
    """An ISO 8601 time with its zone, not beyond CLOCK_SKEW in the future, as UTC ISO 8601 (which
    sorts as time does); anything else a ValueError: a date that is text (`zzz`) or years ahead
    (`9999-12-30`) would sort after every real sweep and keep its entry for ever."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an ISO 8601 time (2025-06-01T12:00:00+00:00)") from None
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone (2025-06-01T12:00:00+00:00)")
    now = datetime.now(UTC)
    if when > now + CLOCK_SKEW:
        raise ValueError(f"{text!r} is in the future (now {now:%Y-%m-%d %H:%M} UTC); a sweep's date is when it ran")
    return when.astimezone(UTC).isoformat()


def _lessons(f: _SweepFile) -> Lessons:
    """One sweep's entry, less the numbers no measurement could give (each named in `refused`)."""
    refused: list[str] = []

    def plausible(what: str, value: float, lo: float, hi: float) -> bool:
        if lo <= value <= hi:
            return True
        refused.append(f"{f.name}: {what} {value:.4g} is implausible (a measurement gives {lo:g} to {hi:g}); not used")
        return False

    cal, mem = f.calibration, f.memory
    if cal is not None and not (
        plausible("compute_scale", cal.compute_scale, *CALIBRATION_BOUNDS)
        & plausible("comm_scale", cal.comm_scale, *CALIBRATION_BOUNDS)
        & plausible("calibration trials", cal.trials, 0, MAX_COUNT)
    ):
        cal = None
    effects: dict[EffectKey, LearnedEffect] = {}
    for e in f.effects:
        if abs(e.log_ratio) > EFFECT_BOUND:
            refused.append(
                f"{f.name}: {e.knob}={value_text(e.value)} {ratio_text(e.log_ratio)}: implausible (a measured effect is "
                f"within {math.exp(EFFECT_BOUND):g}x either way); not used"
            )
        elif plausible(f"{e.knob}={value_text(e.value)} trials", e.trials, 1, MAX_COUNT):
            effects[(e.knob, e.value)] = LearnedEffect(e.log_ratio, e.trials)
    if mem is not None and not (
        plausible("memory act_scale", mem.act_scale, *MEMORY_SCALE_BOUNDS)
        & plausible("memory offset_gib", mem.offset_gib, -MAX_OFFSET_GIB, MAX_OFFSET_GIB)
        & (mem.reserved_factor is None or plausible("memory reserved_factor", mem.reserved_factor, *RESERVED_BOUNDS))
        & plausible("memory peaks", mem.peaks, 0, MAX_COUNT)
    ):
        mem = None
    return Lessons(
        sweep_id=f.id,
        name=f.name,
        model=f.model,
        nodes=f.nodes,
        date=f.date,
        trials=f.trials,
        measured=f.measured,
        calibration=Calibration(cal.compute_scale, cal.comm_scale, cal.trials) if cal else None,
        effects=effects,
        memory=MemoryLesson(mem.act_scale, mem.offset_gib, mem.reserved_factor, mem.peaks) if mem else None,
        host=f.host,
        results=f.results,
        refused=tuple(refused),
    )


def _record(s: Lessons) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": s.sweep_id,
        "name": s.name,
        "model": s.model,
        "nodes": s.nodes,
        "date": s.date,
        **({"host": s.host} if s.host else {}),
        **({"results": s.results} if s.results else {}),
        "trials": s.trials,
        "measured": s.measured,
    }
    if s.calibration is not None:
        c = s.calibration
        out["calibration"] = {
            "compute_scale": round(c.compute_scale, 4),
            "comm_scale": round(c.comm_scale, 4),
            "trials": c.trials,
        }
    out["effects"] = [
        {"knob": k, "value": v, "log_ratio": round(e.log_ratio, 4), "trials": e.trials}
        for (k, v), e in sorted(s.effects.items(), key=lambda item: (item[0][0], str(item[0][1])))
    ]
    if s.memory is not None:
        m = s.memory
        out["memory"] = {
            "act_scale": round(m.act_scale, 4),
            "offset_gib": round(m.offset_gib, 3),
            "reserved_factor": None if m.reserved_factor is None else round(m.reserved_factor, 4),
            "peaks": m.peaks,
        }
    return out


def read(path: Path) -> LearnedProfile:
    """A learned profile file, through the one reader (`sweeper.files`: a regular file of at most
    MAX_LEARNED_BYTES, numbers bounded, no key twice); a malformed one is refused in one line naming
    the file and the field."""
    try:
        data = parse_yaml(read_limited(path, max_bytes=MAX_LEARNED_BYTES), path)
    except FileRefused as e:
        raise SpecError(f"{e} (a learned profile; `sweep profile forget --learned {path}` drops it)") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: not a learned profile (expected a mapping with schema: {SCHEMA}, kind: {KIND})")
    try:
        f = _ProfileFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "the file"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        raise SpecError(
            f"{path}: {field}: {msg} (a learned profile of schema {SCHEMA}; "
            f"`sweep profile forget --learned {path}` drops it)"
        ) from None
    return LearnedProfile(LearnedKey(f.cluster, f.gpu, f.trainer), tuple(_lessons(s) for s in f.sweeps), path)


def load(key: LearnedKey) -> LearnedProfile | None:
    """The learned profile of `key`, or None when no sweep on it has been remembered."""
    path = key.path
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        check_cached(path)
    except FileRefused as e:
        raise SpecError(f"the learned profile of {key}: {e}") from None
    profile = read(path)
    if profile.key != key:
        raise SpecError(f"{path}: holds the learned profile of {profile.key}, not of {key} as its name says")
    return profile


def save(key: LearnedKey, lessons: Lessons) -> Path:
    """Put one sweep's lessons into its key's profile (replacing that sweep's earlier entry), atomically,
    under a lock: two sweeps on one cluster may finish trials at the same moment."""
    folder = learned_dir()
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / ".lock"):
        old = load(key)
        others = [s for s in (old.sweeps if old else ()) if s.sweep_id != lessons.sweep_id]
        # this sweep's own lessons always stay: no entry, whatever its date, keeps them out
        others = sorted(others, key=lambda s: checked_date(s.date))[-(MAX_SWEEPS - 1) :]
        sweeps = sorted([*others, lessons], key=lambda s: checked_date(s.date))
        data = {"schema": SCHEMA, "kind": KIND, "cluster": key.cluster, "gpu": key.gpu, "trainer": key.trainer}
        data["sweeps"] = [_record(s) for s in sweeps]
        atomic_write_text(key.path, yaml.safe_dump(data, sort_keys=False))
    return key.path


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def ratio_text(log_ratio: float) -> str:
    """A log ratio as 'N.NNx the model's step time (...)'; beyond what a float holds, as exp(x)."""
    r = f"{math.exp(log_ratio):.2f}" if abs(log_ratio) < 700 else f"exp({log_ratio:.3g})"
    how = (
        "as predicted"
        if abs(log_ratio) < 0.005
        else "slower than predicted"
        if log_ratio > 0
        else "faster than predicted"
    )
    return f"{r}x the model's step time ({how})"


def value_text(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)
