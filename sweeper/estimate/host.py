"""What the host and its cores add to a step, apart from the prices of the work (`profiled_work`).

The host's own time per block (launches, Python, autograd; on a CPU also what the tiny block measured
beyond its priced operations, and what tensor parallelism's dispatch adds), and how the cores are
shared: a crowd of processes on too few cores computes slower, a pipeline's busiest core sets its pace,
and an idle stage's core goes to the others on a shared host. Pure; `sweeper.estimate.profiled`
applies them to every part of the step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.profiled_work import block_prices, tp_block_comm
from sweeper.estimate.shapes import BLOCK_KNOBS, TINY_ROWS
from sweeper.layouts.stages import pipeline_shapes, stage_layers
from sweeper.profiles.lookup import Lookup
from sweeper.profiles.profile import Profile

if TYPE_CHECKING:
    from sweeper.layouts.layout import Columns
    from sweeper.spec.models import ModelShape


def host_overhead(lookup: Lookup, m: ModelShape, cols: Columns, *, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """The block's host overhead per micro-batch (launches, Python, autograd) and checkpointing's own:
    each measured tiny block less its priced operations at that shape, base plus each knob's change."""
    n = len(cols["tp"])
    base_s = lookup.block_s("base", "base")
    if base_s is None:
        return np.zeros(n), np.zeros(n)
    settings = lookup.profile.block_base

    def residual(knob: str, value: str) -> float:
        s = dict(settings) | ({knob: value} if knob != "base" else {})
        one = {k: np.array([_typed(k, s.get(k, "false"))]) for k in BLOCK_KNOBS}
        one |= {"micro_batch_size": np.array([1]), "float8": np.array([False]), "tp": np.array([1])}
        tiny = block_prices(
            lookup,
            m,
            rows=np.array([float(TINY_ROWS)]),
            tp=np.array([1.0]),
            sp=np.array([False]),
            cols=one,
            dtype=dtype,
        )
        priced = tiny.total() + tiny.recompute(one["activation_checkpointing"])
        measured = lookup.block_s(knob, value)
        return float(measured - priced[0]) if measured is not None else 0.0

    base = max(residual("base", "base"), 0.0)
    framework, recompute = np.full(n, base), np.zeros(n)
    for knob in BLOCK_KNOBS:
        for value in np.unique(cols[knob]):
            text = _text(value)
            if lookup.block_s(knob, text) is None:
                continue
            delta = residual(knob, text) - base
            target = recompute if knob == "activation_checkpointing" else framework
            target += np.where(cols[knob] == value, delta, 0.0)
    return np.maximum(framework, 0.0), np.maximum(recompute, 0.0)


def host_block_s(lookup: Lookup, cols: Columns) -> np.ndarray:
    """The host's time per block and micro-batch as the tiny block measured it: the base, plus each
    knob value's measured difference."""
    base = lookup.block_s("base", "base") or 0.0
    out = np.full(len(cols["tp"]), base)
    for knob in BLOCK_KNOBS:
        for value in np.unique(cols[knob]):
            measured = lookup.block_s(knob, _text(value))
            if measured is not None:
                out += np.where(cols[knob] == value, measured - base, 0.0)
    return out


def tp_overhead(lookup: Lookup, m: ModelShape, cols: Columns, *, dtype: str) -> np.ndarray:
    """What tensor parallelism adds to the block's host overhead per micro-batch (DTensor's dispatch,
    the plan's hooks): the tiny block split over the profile's ranks (knob tp, or tp_sp with sequence
    parallelism) less the tiny block alone and its collectives at that size (priced in tp_comm)."""
    tp = cols["tp"].astype(float)
    out = np.zeros(len(tp))
    base = lookup.block_s("base", "base")
    if base is None:
        return out
    for knob, sp in (("tp", False), ("tp_sp", True)):
        sizes = sorted(int(b.value) for b in lookup.profile.block if b.knob == knob)
        for size in sizes:
            point = lookup.blocks[(knob, str(size))]
            nearest = np.abs(tp - size) == np.min([np.abs(tp - x) for x in sizes], axis=0)
            rows = (tp > 1) & nearest & (cols["effective_sp"].astype(bool) == sp)
            tiny_bytes = point.rows * m.hidden * (2 if dtype == "bf16" else 4)
            comm = tp_block_comm(lookup, np.array([float(size)]), np.array([float(tiny_bytes)]), np.array([sp]))
            out[rows] = max(point.seconds - base - float(np.nan_to_num(comm)[0]), 0.0)
    return out


def _text(value: object) -> str:
    return str(value).lower() if isinstance(value, (bool, np.bool_)) else str(value)


def _typed(knob: str, text: str) -> object:
    return text == "true" if knob == "compile" else text


def idle_costs(profile: Profile, world: int) -> float:
    """1 where a pipeline stage's idle time is lost; 0 where the nodes are namespaces of one machine
    with more ranks than cores: there a waiting stage gives its core to the others, whose work (priced
    at the profile's contention) then goes faster by as much, so the bubble costs no time."""
    return 0.0 if profile.shared_host and world > profile.cpus else 1.0


def oversubscription(profile: Profile, processes: int) -> float:
    """On a CPU node: how much slower each process computes when more processes share its cores than
    the profile was measured for (each trial process takes cores / processes threads, at least one)."""
    if profile.gpu != "cpu":
        return 1.0

    def load(n: int) -> float:
        return max(1.0, n * max(1, profile.cpus // n) / profile.cpus)

    return load(processes) / load(profile.processes)


def core_share(
    profile: Profile, cols: Columns, layers: int, ranks: tuple[int, int], *, block_s: np.ndarray, end_s: np.ndarray
) -> np.ndarray:
    """Where one host's ranks outnumber its cores (CPU ranks, bound one core each, round-robin, by the
    local launcher: `sweeper.launchers.ranks.core_of`, rank r on core r mod cores): the busiest core's work over the busiest rank's as priced. Every part was measured
    with all ranks working at once, so a rank's price already holds its share of a crowded core; but a
    core whose other ranks hold lighter pipeline stages gives the busiest one more of its time (pp=4
    on 2 cores: the last stage, a block and the head, shares its core with a stage of one block).
    `ranks`: (the world, the ranks of one host); `block_s`: a block's seconds a micro-batch; `end_s`:
    the head's and the loss's (the last stage). 1 where each rank has a core, and for layouts whose
    ranks all carry the same work."""
    world, host_ranks = ranks
    share = np.ones(len(cols["pp"]))
    if profile.gpu != "cpu" or host_ranks <= profile.cpus:
        return share
    cores = profile.cpus
    for pp_value, chunks in pipeline_shapes(cols):
        if pp_value == 1 or pp_value > layers:
            continue
        rows = (cols["pp"] == pp_value) & (cols["chunks"] == chunks)
        held = np.array(stage_layers(layers, pp_value, chunks), dtype=float)
        work = held[:, None] * block_s[rows][None, :]  # (stage, layout)
        work[-1] += end_s[rows]
        # the mesh's pp dimension is outermost: each stage's ranks are world / pp adjacent ones
        stage_of = np.arange(world) * pp_value // world
        busiest = np.zeros(int(rows.sum()))
        for first in range(0, world, host_ranks):  # each host, its ranks bound from core 0
            load = np.zeros((cores, len(busiest)))
            for local in range(host_ranks):
                load[local % cores] += work[stage_of[first + local]]
            busiest = np.maximum(busiest, load.max(axis=0))
        share[rows] = busiest / (host_ranks / cores * work.max(axis=0))
    return share
