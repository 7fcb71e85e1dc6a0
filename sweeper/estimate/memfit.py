"""Learning memory both ways during a sweep: refits from measured peaks, the mirror rule, probes.

Pure numpy over the plan's columns and its `Estimate`. The estimate can be wrong both ways;
what a trial measures corrects it in both directions:

- `refit`: measured peaks (torch's max allocated, and max reserved where the trainer logs it:
  the built-in trainer on a GPU, Megatron-LM's "max allocated / max reserved" line,
  torchtitan's reserved memory line) fit a scale on the activations and a fixed offset; the
  refitted totals re-admit pruned layouts that now fit and exclude untried ones that do not.
- `needs_at_most` (the mirror of `needs_at_least`): a layout that ran proves that every
  layout needing no more memory than it fits too; `mirror` says by how much at least the
  estimate was too high when the layout that ran had been estimated over the card.
- `probe_rows`: pruned layouts within a small margin of the card whose predicted MFU clearly
  beats every candidate get one trial instead of being dropped unseen.
- `fit_chance`: the chance a layout fits under the estimate's measured error; the plan makes a
  layout over the card `uncertain` (tried, weighed by that chance) rather than pruned while it is
  at least `MIN_FIT_CHANCE`.
- `fit_chance_given`: the same chance once layouts of the sweep ran or ran out of memory, with no
  peak measured (a replay, a CPU run, a trainer that logs none): most of the estimate's error is
  shared by the layouts of one sweep (`MEMORY_SHARED_SHARE`), so a layout estimated over the card
  that ran says the estimate is high for its neighbours too, and an OOM that it is low.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sweeper.estimate.memory import SCORE_KERNELS, Estimate
from sweeper.knobs import KNOBS
from sweeper.layouts.layout import Columns
from sweeper.spec.hardware import GIB

# How much memory a knob value asks for, in a partial order (None: comparable only with itself).
_CKPT_LEVEL = {"full": 0, "selective": 1, "ffn": 1, "none": 2}
MONOTONE = ("micro_batch_size", "activation_checkpointing", "sequence_parallel", "attention", "rmsnorm")


def _level(cols: Columns, knob: str) -> np.ndarray:
    v = cols[knob]
    if knob == "micro_batch_size":
        return v.astype(float)
    if knob == "activation_checkpointing":
        return np.vectorize(_CKPT_LEVEL.get, otypes=[float])(v)
    if knob == "sequence_parallel":
        return (~v.astype(bool)).astype(float)  # no SP keeps more
    if knob == "attention":
        return np.isin(v, SCORE_KERNELS).astype(float)
    if knob == "rmsnorm":
        return (v == "eager").astype(float)
    raise KeyError(knob)


def needs_at_least(cols: Columns, rows: np.ndarray, ref: int) -> np.ndarray:
    """Mask over `rows`: layouts that need at least the memory of layout `ref` (itself included)."""
    mask = np.ones(len(rows), dtype=bool)
    for k in KNOBS:
        if k in MONOTONE:
            continue
        mask &= cols[k][rows] == cols[k][ref]
    for k in MONOTONE:
        lv = _level(cols, k)
        mask &= lv[rows] >= lv[ref]
        if k == "activation_checkpointing":
            # ffn and selective are not ordered between themselves
            both_mid = (lv[rows] == 1) & (lv[ref] == 1)
            mask &= ~both_mid | (cols[k][rows] == cols[k][ref])
    return mask


# The estimate's measured error: benchmarks/memory_accuracy.py, 40 peaks measured by others
# (Megatron-LM CI, torchtitan, torchao, DeepSpeed), p90 |error| 20.7 %. Taken as a log-normal
# error, its sigma is ln(1.207) / z(0.95). Not fitted to the llm-foundry or ultrascale data,
# which check it (benchmarks/search_bench.py --public, tests/search/test_acquisition.py).
MEMORY_LOG_SIGMA = math.log(1.207) / 1.645
MIN_FIT_CHANCE = 0.01  # a layout less likely than this to fit is pruned; above it, it is uncertain
# How much of that error one sweep's layouts share (one trainer, model, card and allocator): of the
# variance of log(estimate / measured) over the same peaks, the part between settings (source, model,
# card); within one, the errors spread 0.034 (sd), across all 0.095: 87 % shared
# (benchmarks/memory_accuracy.py prints it). Taken as 0.85.
MEMORY_SHARED_SHARE = 0.85
_GRID = np.linspace(-5.0, 5.0, 401)  # the shared error, in units of its own sigma


def fit_chance_given(
    total: np.ndarray,
    capacity: float,
    ran: np.ndarray,
    oom: np.ndarray,
    sigma: float = MEMORY_LOG_SIGMA,
    shared: float = MEMORY_SHARED_SHARE,
) -> np.ndarray:
    """The chance each layout estimated at `total` bytes fits `capacity`, once layouts estimated at
    `ran` (bytes) ran and layouts estimated at `oom` ran out of memory. The log error of an estimate is
    a shared part s ~ N(0, shared sigma^2) plus the layout's own, N(0, (1 - shared) sigma^2); what ran and
    what did not are censored observations of s (each fits when s + its own error <= log(capacity /
    estimate)), weighed on a grid of s. With nothing observed this is `fit_chance`."""
    s_sd, own_sd = sigma * math.sqrt(shared), sigma * math.sqrt(1.0 - shared)
    s = _GRID * s_sd
    log_post = -0.5 * _GRID**2
    for estimates, fitted in ((ran, True), (oom, False)):
        for e in np.asarray(estimates, dtype=float):
            p = normal_cdf((math.log(capacity / max(e, 1.0)) - s) / own_sd)
            log_post += np.log(np.clip(p if fitted else 1.0 - p, 1e-300, 1.0))
    post = np.exp(log_post - log_post.max())
    post /= post.sum()
    head = np.log(capacity / np.maximum(np.asarray(total, dtype=float), 1.0))
    # the chance is smooth in the headroom: priced on at most _GRID.size points, then interpolated,
    # so a plan of a million layouts in doubt costs what one of a few hundred does
    at = head if head.size <= _GRID.size else np.linspace(head.min(), head.max(), _GRID.size)
    chance = normal_cdf((at[:, None] - s[None, :]) / own_sd) @ post
    return np.asarray(chance if at is head else np.interp(head, at, chance), dtype=float)


def fit_chance(total: np.ndarray, capacity: float, sigma: float = MEMORY_LOG_SIGMA) -> np.ndarray:
    """The chance the true need is within `capacity` when the estimate is `total` (log-normal error)."""
    ratio = capacity / np.maximum(np.asarray(total, dtype=float), np.finfo(float).tiny)
    return normal_cdf(np.log(ratio) / sigma)


_ERFC = np.frompyfunc(math.erfc, 1, 1)


def normal_cdf(z: np.ndarray) -> np.ndarray:
    """The standard normal CDF, 0.5 * erfc(-z / sqrt 2), elementwise (scipy.special.ndtr's values:
    importing scipy.special cost every command that plans 0.5 s of CPU, for one function)."""
    return np.asarray(0.5 * _ERFC(-np.asarray(z, dtype=float) / math.sqrt(2)), dtype=float)


SCALE_BOUNDS = (0.3, 3.0)  # a refit that wants more than this is a wrong model, not a scale
PROBE_CLEAR = 0.03  # a probe must beat the best candidate's predicted MFU by this share
MAX_PROBES = 1


@dataclass(frozen=True)
class MemoryFit:
    """allocated' = states + act_scale * (activations + logits) + offset; reserved' = allocated' * reserved_factor."""

    act_scale: float = 1.0
    offset_bytes: float = 0.0
    reserved_factor: float | None = None  # None: the recipe's (the estimate's own ratio)
    points: int = 0

    def describe(self) -> str:
        rf = f", reserved {self.reserved_factor:.2f}x allocated" if self.reserved_factor else ""
        return (
            f"activations x{self.act_scale:.2f}, {self.offset_bytes / GIB:+.2f} GiB fixed{rf} "
            f"(from {self.points} measured peak{'s' if self.points != 1 else ''})"
        )


def refit(
    est: Estimate,
    rows: Sequence[int],
    allocated_gib: Sequence[float | None],
    reserved_gib: Sequence[float | None],
    *,
    prior: MemoryFit | None = None,
) -> MemoryFit:
    """Fit the activation scale and the fixed offset to measured peaks of finished layouts.

    Where only reserved is measured, allocated is taken as reserved / the estimate's gap.
    One peak: the scale that explains it (clipped), the rest as offset. Two or more with
    different activations: least squares on [activations, 1].

    `prior` (a learned profile's fit, from other sweeps): what the sweep's own peaks cannot
    tell comes from it, and nothing else: one peak (or peaks of the same activations) keeps the
    prior's fixed offset and fits the scale that explains them exactly; two peaks that can split
    scale and offset drop it. Its reserved factor stands until a peak of this sweep gives one.
    """
    idx, alloc, ratios = [], [], []
    for r, a, v in zip(rows, allocated_gib, reserved_gib):
        gap = float(est.reserved[r] / max(est.allocated[r], 1.0))
        if a and a > 0:
            idx.append(r)
            alloc.append(a * GIB)
            if v and v > 0:
                ratios.append(v / a)
        elif v and v > 0:
            idx.append(r)
            alloc.append(v * GIB / gap)
    if not idx:
        return prior or MemoryFit()
    i = np.asarray(idx, dtype=int)
    act = est.activations[i] + est.logits[i]
    states = est.allocated[i] - act
    y = np.asarray(alloc) - states
    if len(i) >= 2 and np.ptp(act) > 0.05 * float(np.mean(act)):
        (scale, offset), *_ = np.linalg.lstsq(np.stack([act, np.ones_like(act)], axis=1), y, rcond=None)
        scale = float(np.clip(scale, *SCALE_BOUNDS))
        offset = float(np.mean(y - scale * act))
    else:
        known = prior.offset_bytes if prior is not None else 0.0
        scale = float(np.clip(np.mean(y - known) / max(float(np.mean(act)), 1.0), *SCALE_BOUNDS))
        offset = float(np.mean(y - scale * act))
    factor = float(np.median(ratios)) if ratios else (prior.reserved_factor if prior is not None else None)
    return MemoryFit(scale, offset, factor, len(i))


def refitted_total(est: Estimate, fit: MemoryFit) -> np.ndarray:
    """Bytes each layout takes on the card under the fit: refitted reserved + the overhead."""
    act = est.activations + est.logits
    allocated = est.allocated - act + fit.act_scale * act + fit.offset_bytes
    gap = est.reserved / np.maximum(est.allocated, 1.0) if fit.reserved_factor is None else fit.reserved_factor
    return allocated * gap + est.overhead


def needs_at_most(cols: Columns, rows: np.ndarray, ref: int) -> np.ndarray:
    """Mask over `rows`: layouts that need no more memory than layout `ref` (itself included).

    The partial order of `learn.needs_at_least`, reversed: equal parallel degrees, sharding and
    schedule, and no monotone knob asking for more (micro-batch, checkpointing, sequence
    parallel, score-keeping attention, eager norm)."""
    mask = np.ones(len(rows), dtype=bool)
    for k in KNOBS:
        if k not in MONOTONE:
            mask &= cols[k][rows] == cols[k][ref]
    for k in MONOTONE:
        lv = _level(cols, k)
        mask &= lv[rows] <= lv[ref]
        if k == "activation_checkpointing":
            both_mid = (lv[rows] == 1) & (lv[ref] == 1)  # ffn and selective are not ordered
            mask &= ~both_mid | (cols[k][rows] == cols[k][ref])
    return mask


@dataclass(frozen=True)
class Mirror:
    """What one layout that ran teaches: the pruned layouts it re-admits, and how far at least
    the estimate was too high (bytes over the usable card it had been estimated at; 0 if none)."""

    readmit: np.ndarray
    too_high_bytes: float
    too_high_share: float


def mirror(cols: Columns, total: np.ndarray, capacity: float, ok_row: int, pruned: np.ndarray) -> Mirror:
    """The mirror rule for a layout that ran: every pruned layout needing no more memory is re-admitted."""
    pruned = np.asarray(pruned, dtype=int)
    hit = pruned[needs_at_most(cols, pruned, ok_row)] if pruned.size else pruned
    over = max(float(total[ok_row]) - capacity, 0.0)
    return Mirror(hit, over, over / capacity if capacity else 0.0)


def near_card(total: np.ndarray, capacity: float, margin: float, pruned: np.ndarray) -> np.ndarray:
    """Mask: pruned layouts whose total is within `margin` (a share) of the usable card."""
    return pruned & (total <= capacity * (1 + margin))


def probe_rows(
    total: np.ndarray,
    capacity: float,
    margin: float,
    pruned: np.ndarray,
    candidates: np.ndarray,
    pred_mfu: np.ndarray,
    *,
    clear: float = PROBE_CLEAR,
    limit: int = MAX_PROBES,
) -> list[int]:
    """Pruned layouts near the card whose predicted MFU beats every candidate by `clear`, best first."""
    near = np.flatnonzero(near_card(total, capacity, margin, pruned))
    best = float(np.nanmax(pred_mfu[candidates])) if np.any(candidates) else 0.0
    good = near[pred_mfu[near] > best * (1 + clear)]
    return [int(r) for r in good[np.argsort(-pred_mfu[good], kind="stable")][:limit]]
