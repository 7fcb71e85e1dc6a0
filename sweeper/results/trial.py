"""What one trial yields: `TrialResult` (fields named like the results columns) and the metrics from step times.

Pure: no torch. The trainer measures step times, losses and peak memory; `summarize` turns
them into throughput, TFLOP/s, MFU and HFU with the FLOP model of `sweeper.estimate.flops`.
"""

from __future__ import annotations

import math
import platform
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from sweeper.estimate.flops import hardware_flops_per_token, model_flops_per_token, tflops_per_device, utilization
from sweeper.layouts.layout import Layout
from sweeper.results.noise import interval_fields
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus

# Short names kept for the trainer and launchers, which set them in many places.
OK, OOM, KERNEL_UNAVAILABLE, TIMEOUT, FAILED = (
    TrialStatus.OK,
    TrialStatus.OOM,
    TrialStatus.KERNEL_UNAVAILABLE,
    TrialStatus.TIMEOUT,
    TrialStatus.FAILED,
)
STATUSES: tuple[str, ...] = tuple(TrialStatus)
# The error of a trial of a GPU sweep that found no usable GPU: every later trial would fail
# the same way, so the sweep stops after it (see `stops_sweep`).
NO_ACCELERATOR = "no usable GPU"


def stops_sweep(row: dict[str, Any]) -> bool:
    """A result that says the machine, not the layout, is broken: running more trials is pointless."""
    return row.get("status") == FAILED and str(row.get("error") or "").startswith(NO_ACCELERATOR)


@dataclass
class TrialResult:
    """One trial's outcome and measurements. A value that was not measured is None, never 0.

    Its fields, in order, are the results columns after `trial_number` (see `sweeper.results.rows.SCHEMA`).
    """

    status: TrialStatus
    # the layout's knobs (pinned to sweeper.knobs.KNOBS by tests/common/test_knobs.py) and derived sizes
    tp: int | None = None
    pp: int | None = None
    micro_batch_size: int | None = None
    sequence_parallel: bool | None = None
    activation_checkpointing: str | None = None
    attention: str | None = None
    rmsnorm: str | None = None
    sharding: str | None = None
    pp_schedule: str | None = None
    virtual_stages: int | None = None
    compile: bool | None = None
    float8: bool | None = None
    cp: int | None = None
    ep: int | None = None
    etp: int | None = None
    dp: int | None = None
    grad_accum: int | None = None
    num_devices: int | None = None
    mfu: float | None = None
    hfu: float | None = None
    tflops_per_gpu: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    step_times_s: list[float] = field(default_factory=list)
    step_time_mean_s: float | None = None
    step_time_std_s: float | None = None
    # the noise of the mean (sweeper.results.noise): steps averaged, half-width of the 95% t interval of the
    # mean step time, and the MFU at the interval's ends (mfu_high null: the interval reaches 0 s)
    steps_measured: int | None = None
    step_time_ci_s: float | None = None
    mfu_low: float | None = None
    mfu_high: float | None = None
    losses: list[float] = field(default_factory=list)
    startup_s: float | None = None  # process start to the first step, slowest rank
    peak_mem_gib: float | None = None  # max over ranks; CUDA: max allocated; CPU: peak RSS growth
    peak_mem_reserved_gib: float | None = None  # CUDA max reserved; None on CPU
    peak_mem_steady_gib: float | None = None  # like peak_mem_gib, from the end of the warm-up steps on
    error: str | None = None
    device: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None  # torch's CUDA build (None: a CPU build)
    nccl_version: str | None = None
    gpu_name: str | None = None  # as the driver names it, e.g. "NVIDIA H100 80GB HBM3"
    python_version: str = field(default_factory=platform.python_version)

    def __post_init__(self) -> None:
        self.status = TrialStatus(self.status)  # a plain string from JSON becomes the enum; a typo raises

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialResult:
        """From `to_dict` output; unknown keys are ignored (results written by a newer version)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


# what a trial's own numbers can be: a step takes a positive, finite time (under 1e6 s), and MFU is a
# fraction of the peak, in (0, 1]; a row outside that (a replay table's negative or NaN step times,
# an MFU of 5.0) is no measurement, and the search must never learn from it
MAX_STEP_S = 1e6
MEASURED = (
    "mfu",
    "hfu",
    "mfu_low",
    "mfu_high",
    "tflops_per_gpu",
    "tokens_per_s",
    "tokens_per_s_per_gpu",
    "step_time_mean_s",
    "step_time_std_s",
    "step_time_ci_s",
)


def _seconds(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 < v < MAX_STEP_S


def impossible(values: Mapping[str, Any]) -> str | None:
    """Why a finished trial's numbers cannot be measurements (None when they can): a step time that
    is not finite and positive, or an MFU outside (0, 1]. Only a trial whose steps ran is asked."""
    status = values.get("status")
    if status not in STATUSES or not (TrialStatus(status).succeeded() or TrialStatus(status).was_stopped()):
        return None
    for i, t in enumerate(values.get("step_times_s") or []):
        if not _seconds(t):
            return f"step {i + 1} took {t} s; a step time is finite, positive and under {MAX_STEP_S:g} s"
    mean = values.get("step_time_mean_s")
    if mean is not None and not _seconds(mean):
        return f"step_time_mean_s is {mean}; a step time is finite, positive and under {MAX_STEP_S:g} s"
    mfu = values.get("mfu")
    if mfu is not None and not (isinstance(mfu, int | float) and 0 < mfu <= 1):
        return f"mfu is {mfu}; an MFU is a fraction of the peak, in (0, 1]"
    low, high = values.get("mfu_low"), values.get("mfu_high")
    if mfu is not None and isinstance(low, int | float) and not low <= mfu * (1 + 1e-9):
        return f"mfu is {mfu}, below its own interval's low end {low}"
    if mfu is not None and isinstance(high, int | float) and not mfu <= high * (1 + 1e-9):
        return f"mfu is {mfu}, above its own interval's high end {high}"
    return None


def as_failed(values: Mapping[str, Any], why: str) -> dict[str, Any]:
    """The row of a trial whose numbers are impossible (`impossible`): failed, with the reason, and
    none of its derived numbers (the search and the report read only what could be measured)."""
    out = dict(values) | dict.fromkeys(MEASURED)
    out["status"] = FAILED
    out["error"] = f"impossible numbers: {why}" + (f" ({values['error']})" if values.get("error") else "")
    return out


def layout_fields(layout: Layout, sweep: Sweep) -> dict[str, Any]:
    """The knobs of `layout` and its derived dp and grad_accum, as result fields."""
    return layout.resolve(sweep).as_fields()


def without_run(
    sweep: Sweep, layout: Layout, *, status: TrialStatus | str, error: str | None, **measured: Any
) -> TrialResult:
    """A result for a trial that produced no usable step times (failed, timed out, ...)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, but got {status!r}")
    return TrialResult(status=TrialStatus(status), error=error, **layout_fields(layout, sweep), **measured)


def _finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


def summarize(
    sweep: Sweep,
    layout: Layout,
    *,
    step_times_s: Sequence[float],
    losses: Sequence[float],
    peak_mem_gib: float | None = None,
    peak_mem_reserved_gib: float | None = None,
    **extra: Any,
) -> TrialResult:
    """An `ok` result with the metrics of the protocol: drop the warm-up steps, average the rest.

    tokens/s = global_batch_size * seq_len / mean step time; MFU = tokens/s * model FLOPs per
    token / (devices * peak FLOP/s of the sweep's GPU in its precision); HFU adds recomputation.
    The measured steps' spread gives the mean and the MFU their interval (`sweeper.results.noise`).
    """
    warmup = sweep.trial.warmup_steps
    kept = list(step_times_s)[warmup:]
    if not kept or not _finite(kept):
        raise ValueError(f"need positive step times after {warmup} warm-up steps, but got {list(step_times_s)}")
    base = layout_fields(layout, sweep)
    devices = base["num_devices"]
    mean = statistics.fmean(kept)
    tokens_per_s = sweep.global_batch_size * sweep.seq_len / mean
    model_flops = model_flops_per_token(sweep.model, sweep.seq_len)
    hw_flops = hardware_flops_per_token(sweep.model, sweep.seq_len, layout.activation_checkpointing)
    peak = sweep.cluster.gpu.peak_flops(sweep.trial.precision)
    mfu = utilization(tokens_per_s, model_flops, num_devices=devices, peak_flops=peak)
    return TrialResult(
        status=OK,
        step_times_s=list(step_times_s),
        step_time_mean_s=mean,
        step_time_std_s=statistics.stdev(kept) if len(kept) > 1 else None,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / devices,
        tflops_per_gpu=tflops_per_device(tokens_per_s, model_flops, num_devices=devices),
        mfu=mfu,
        **interval_fields(kept, mfu),
        hfu=utilization(tokens_per_s, hw_flops, num_devices=devices, peak_flops=peak),
        peak_mem_gib=peak_mem_gib,
        peak_mem_reserved_gib=peak_mem_reserved_gib,
        losses=list(losses),
        **base,
        **extra,
    )


STEPS_FILE = "steps.txt"  # one step time (seconds) per line, written by the built-in trainer's rank 0
