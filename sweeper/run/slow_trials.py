"""What the sweep loop does with a trial's outcome beyond recording it: stop clearly slow trials, and
say which failed ones get a second attempt (`crashed`).

Stop clearly slow trials: read a running trial's step times, report them to the study's pruner, and
turn a trial the pruner stops into a `stopped_early` result with the GPU time it saved.

Step times come from the built-in trainer's `steps.txt` (rank 0 appends one line per step, see
`sweeper.runtime.runner`) or from an external trainer's log (`workload.log`, read with the
workload's own parser), wherever under the trial's folder the launcher put them. A launcher that
answers at once (replay) is judged on the finished trial's steps, as if they had come one by one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sweeper.launchers.base import JobOutcome, TrialJob
from sweeper.results.trial import STEPS_FILE, TrialResult, stops_sweep, summarize
from sweeper.search.stopping import STOP_SLOWER, gpu_hours_saved, step_mfu
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus

if TYPE_CHECKING:
    from sweeper.run.state import Running, SweepRun

WORKLOAD_LOG = "workload.log"
REPORTED_STEPS = 5  # the "first measured steps": a trial not stopped after these runs to its end


def read_steps_file(path: Path) -> list[float]:
    """The step times in a steps file; a line being written (no newline yet) is left for the next read."""
    try:
        text = path.read_text()
        return [float(x) for x in text.split("\n")[:-1] if x.strip()]
    except (OSError, ValueError):  # a line that is no number: the trial's own result says what happened
        return []


def live_step_times(job: TrialJob) -> list[float]:
    """The step times a running trial has logged so far (empty when none, or no log is readable)."""
    from sweeper.trainers.megatron import parse_megatron
    from sweeper.trainers.torchtitan import parse_torchtitan

    for path in job.workdir.rglob(STEPS_FILE):
        return read_steps_file(path)
    for path in job.workdir.rglob(WORKLOAD_LOG):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return []
        times = parse_megatron(text).step_times_s
        if not times:
            # torchtitan logs tokens/s per device: its step time needs the tokens of a step, not known here
            times = parse_torchtitan(text, tokens_per_step_per_device=0.0).step_times_s
        return times
    return []


def judge(run: SweepRun, item: Running, polled: JobOutcome | None) -> JobOutcome | None:
    """What the sweep loop takes from one poll: the outcome, or a stopped-early one in its place
    (a running trial the pruner stops is cancelled); None while the trial runs on."""
    if polled is None:
        stopped = stop_if_slow(run, item, live_step_times(item.handle.job))
        if stopped is not None:
            run.launcher.cancel(item.handle)
        return stopped
    if polled.result.status == TrialStatus.OK:
        return stop_if_slow(run, item, polled.result.step_times_s, polled) or polled
    return polled


def crashed(run: SweepRun, outcome: JobOutcome) -> bool:
    """A crash worth a second attempt: `failed`, not a missing GPU, not a job someone cancelled, and
    not a replay (its answers repeat)."""
    return (
        outcome.result.status.retried()
        and run.launcher.kind != "replay"
        and not stops_sweep(outcome.result.to_dict())
        and "was cancelled" not in (outcome.result.error or "")
    )


def saved_gpu_hours(sweep: Sweep, result: TrialResult) -> float | None:
    """The GPU-hours a stopped-early trial saved (None for any other)."""
    if result.status != TrialStatus.STOPPED_EARLY:
        return None
    return gpu_hours_saved(sweep, result.step_times_s)


def stop_if_slow(
    run: SweepRun, item: Running, step_times_s: Sequence[float], finished: JobOutcome | None = None
) -> JobOutcome | None:
    """The outcome of stopping the trial now when its first measured steps are clearly slower than the
    best (the study's pruner says so), else None. `finished`: the trial already ended; its steps are
    reported one by one as if it were running (a table with only a mean step time: every step at it)."""
    sweep = run.plan.sweep_of(item.record.row)  # its own node count's world
    times = list(step_times_s or [])
    if finished is not None and not times and finished.result.step_time_mean_s:
        times = [float(finished.result.step_time_mean_s)] * sweep.trial.steps
    if not all(math.isfinite(t) and t > 0 for t in times):
        return None  # impossible step times: the trial ends failed with the reason (results.trial.impossible)
    per_step = step_mfu(sweep, times)[:REPORTED_STEPS]
    if not per_step:
        return None
    k = run.search.report_steps(item.record.optuna_trial, per_step)
    if k is None:
        return None
    ran = times[: sweep.trial.warmup_steps + k]
    if len(ran) > sweep.trial.steps / 2:
        return None  # stopping would save less than half the trial: not worth a result short of steps
    job = item.handle.job
    base = finished.result if finished is not None else None
    result = summarize(sweep, job.layout, step_times_s=ran, losses=(base.losses[: len(ran)] if base else []))
    keep = {"device", "torch_version", "cuda_version", "nccl_version", "gpu_name", "startup_s"}
    if base is not None:
        result = replace(result, **{k: getattr(base, k) for k in keep})
    result.status = TrialStatus.STOPPED_EARLY
    result.error = (
        f"stopped early after {len(ran)} of {sweep.trial.steps} steps: its steps ran at "
        f"{100 * (result.mfu or 0):.1f}% MFU, over {STOP_SLOWER:g}x slower than the best so far and its "
        "interval wholly below the best's"
    )
    return JobOutcome(
        result,
        finished.job_id if finished else item.handle.job_id,
        nodelist=finished.nodelist if finished else None,
        log_path=finished.log_path if finished else None,
    )
