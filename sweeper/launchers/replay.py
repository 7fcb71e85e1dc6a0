"""Replay: answer each trial at once from a table of earlier results (no GPUs, no waiting).

The table is a results dataset of this tool, or any CSV/Parquet with knob columns plus
`status` and `mfu`, `step_time_mean_s` or `step_times_s` (every step of a trial, the warm-up ones
first: its rows then get their mean and noise interval as a run's do). Knobs the table does not have are not matched on, and
a knob with no effect on a layout (sequence parallel at tp=1, sharding at dp=1, ...) is matched
as the value it behaves as, as the plan de-duplicates them. A layout the table lacks has no
answer: the launcher says so at plan time (`cannot_run`), so the search never proposes it.
Users replay an old sweep to try another search strategy at no cost; the search benchmark
replays simulated and published sweeps.
"""

from __future__ import annotations

import io
import json
import math
import statistics
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from sweeper.errors import SpecError
from sweeper.estimate.flops import model_flops_per_token, utilization
from sweeper.files import FileRefused, read_limited
from sweeper.knobs import KNOBS, NO_EFFECT_VALUE
from sweeper.launchers.base import Handle, JobOutcome, Launcher, LauncherProfile, TrialJob, failure
from sweeper.layouts.layout import Columns, Layout, ineffective
from sweeper.results.noise import interval_fields
from sweeper.results.trial import TrialResult, as_failed, impossible
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus

VALUE_COLUMNS = (
    "mfu",
    "step_time_mean_s",
    "step_times_s",
    "peak_mem_gib",
    "tflops_per_gpu",
    "tokens_per_s",
    "error",
    "gpu_name",
)


class ReplayProfile(LauncherProfile):
    """Answers from a table of earlier results (a results dataset, or a CSV/Parquet)."""

    kind: Literal["replay"]
    table: str = Field(min_length=1, description="path of the table; relative to the sweep file's folder")


# a table of earlier results holds thousands of rows, not gigabytes: at most this is read, and at
# most this decoded (`sweeper.parquet_bound`: a few kilobytes of Parquet can decode to gigabytes)
MAX_TABLE_BYTES = 64 << 20


def load_table(path: Path) -> list[dict[str, Any]]:
    """Rows of a replay table (Parquet file or dataset folder, or CSV), read as every file from
    elsewhere is (`sweeper.files.read_limited`: regular files, their size bounded before reading)."""
    import pandas as pd

    if not (path.exists() or path.is_symlink()):
        raise SpecError(f"launcher.table: {path} does not exist")
    try:
        if path.is_dir() and not path.is_symlink():  # a results dataset: its row files, each checked
            parts = sorted(p for p in path.rglob("*.parquet") if not p.name.startswith("."))
            data = [read_limited(p, max_bytes=MAX_TABLE_BYTES) for p in parts]
            if sum(map(len, data)) > MAX_TABLE_BYTES:
                raise FileRefused(f"{path}: its files hold over {MAX_TABLE_BYTES} bytes; at most that is read")
            frame = _parquet_frame(data, parts) if data else None
            if frame is None:
                raise FileRefused(f"{path}: a folder with no Parquet file")
        else:
            raw = io.BytesIO(read_limited(path, max_bytes=MAX_TABLE_BYTES))
            frame = pd.read_csv(raw) if path.suffix.lower() == ".csv" else _parquet_frame([raw.getvalue()], [path])
    except FileRefused as e:
        raise SpecError(f"launcher.table: {e}") from None
    except (OSError, ValueError) as e:
        raise SpecError(f"launcher.table: cannot read {path}: {' '.join(str(e).split())[:200]}") from None
    if "status" not in frame.columns or not {"mfu", "step_time_mean_s", "step_times_s"} & set(frame.columns):
        raise SpecError(f"launcher.table: {path} needs a status column and mfu, step_time_mean_s or step_times_s")
    if not set(KNOBS) & set(frame.columns):
        raise SpecError(f"launcher.table: {path} has no knob columns ({', '.join(KNOBS)})")
    return frame.to_dict("records")


def _parquet_frame(data: list[bytes], paths: list[Path]) -> Any:
    """The Parquet files' rows as one frame, their decoding bounded together by MAX_TABLE_BYTES."""
    import pandas as pd

    from sweeper.results.parquet_bound import read_parquet_bounded

    frames, left = [], MAX_TABLE_BYTES
    for d, p in zip(data, paths, strict=True):
        table = read_parquet_bounded(d, p, max_decoded=left)
        left -= table.nbytes
        frames.append(table.to_pandas())
    return pd.concat(frames, ignore_index=True)


class ReplayLauncher(Launcher):
    """Looks each layout up in the table; a layout that is not there is one it cannot run (left out
    of the plan), and ends as `failed` when asked for all the same."""

    kind = "replay"
    default_startup_s = 0.0  # a replay answers each trial at once from its table
    default_startup_why = "a replay answers from its table"
    runs_steps = False
    poll_s = 0.0
    profile_model = ReplayProfile
    cannot_run_reason = "not in the replay table: a replay answers only the layouts it holds"
    # a replay's step times were measured elsewhere, on a cluster the sweep file may not name (a published
    # table, a what-if): it neither learns the sweep's cluster nor is steered by it, unless the file says so
    measures_here = False

    @classmethod
    def from_profile(cls, profile: LauncherProfile, sweep: Sweep) -> ReplayLauncher:
        assert isinstance(profile, ReplayProfile)
        table = Path(profile.table)
        if not table.is_absolute() and sweep.source is not None:
            table = Path(sweep.source).parent / table
        return cls(table, sweep)

    def __init__(self, table: Path, sweep: Sweep) -> None:
        self.sweep = sweep
        rows = load_table(table)
        self.knobs = [k for k in KNOBS if k in rows[0]] if rows else []
        # a sweep over several node counts matches a table's `nodes` column too (each size its own rows)
        self.by_nodes = sweep.several_sizes and bool(rows) and "nodes" in rows[0]
        self.table: dict[tuple, dict[str, Any]] = {}
        for r in rows:
            if not all(_known(r[k]) for k in self.knobs):  # a row without a knob's value matches no layout
                continue
            if self.by_nodes and not (_known(r["nodes"]) and _norm(r["nodes"]) in sweep.node_counts):
                continue
            layout = Layout.from_mapping({k: _norm(r[k]) for k in self.knobs})
            at = sweep.at(_norm(r["nodes"])) if self.by_nodes else sweep
            cols = layout.columns(at) | ({"nodes": np.asarray([_norm(r["nodes"])])} if self.by_nodes else {})
            self.table.setdefault(self._key(cols)[0], r)  # the first row of a layout wins

    def _key(self, cols: Columns) -> list[tuple]:
        """Each layout's key in the table: its knobs the table has, a knob with no effect there as the
        value it behaves as (a table may record sequence_parallel=False at tp=1 where the sweep says True)."""
        noop = ineffective(cols)
        keyed = [
            np.where(noop[k], NO_EFFECT_VALUE[k], cols[k]) if k in noop else np.asarray(cols[k]) for k in self.knobs
        ]
        if self.by_nodes:
            keyed.append(np.asarray(cols["nodes"]))
        return [tuple(_norm(v) for v in values) for values in zip(*keyed)] if keyed else [()] * len(cols["tp"])

    def cannot_run(self, cols: Columns) -> np.ndarray:
        """The layouts the table has no row for: a replay can answer only what was measured."""
        return np.asarray([key not in self.table for key in self._key(cols)], dtype=bool)

    def submit(self, job: TrialJob) -> Handle:
        return Handle(f"replay-{job.number}", job)

    def poll(self, handle: Handle) -> JobOutcome:
        job = handle.job
        sweep = self.sweep.at(job.nodes) if job.nodes is not None else self.sweep
        cols = job.layout.columns(sweep) | ({"nodes": np.asarray([sweep.cluster.nodes])} if self.by_nodes else {})
        row = self.table.get(self._key(cols)[0])
        if row is None:
            return JobOutcome(failure(TrialStatus.FAILED, "not in replay table", job), handle.job_id)
        result = {k: _clean(row.get(k)) for k in VALUE_COLUMNS if k in row}
        status = str(row["status"])
        if status not in TrialStatus.__members__.values():
            return JobOutcome(
                failure(TrialStatus.FAILED, f"replay table status {status!r} is not a trial status", job), handle.job_id
            )
        result |= {"status": status, **job.layout.as_dict(), "num_devices": sweep.cluster.world}
        if result.get("step_times_s") is not None:
            result["step_times_s"] = _times(result["step_times_s"])
            if result["step_times_s"] is None:
                return JobOutcome(
                    failure(TrialStatus.FAILED, "replay table step_times_s is not a list of numbers", job),
                    handle.job_id,
                )
        measured = (result.get("step_times_s") or [])[sweep.trial.warmup_steps :]
        if (why := impossible(result)) is not None:  # before any arithmetic on them (stdev of NaN raised)
            return JobOutcome(TrialResult.from_dict(as_failed(result, f"replay table row: {why}")), handle.job_id)
        if measured and result.get("step_time_mean_s") is None:
            result["step_time_mean_s"] = statistics.fmean(measured)
        measured_run = TrialStatus(status).succeeded() or TrialStatus(status).was_stopped()  # its steps ran
        if result.get("mfu") is None and result.get("step_time_mean_s") and measured_run:
            tokens_per_s = sweep.global_batch_size * sweep.seq_len / result["step_time_mean_s"]
            fpt = model_flops_per_token(sweep.model, sweep.seq_len)
            result["mfu"] = utilization(
                tokens_per_s,
                fpt,
                num_devices=sweep.cluster.world,
                peak_flops=sweep.cluster.gpu.peak_flops(sweep.trial.precision),
            )
        if len(measured) > 1 and measured_run:  # the spread, as `trial.summarize` keeps it
            result |= {"step_time_std_s": statistics.stdev(measured), **interval_fields(measured, result.get("mfu"))}
        return JobOutcome(TrialResult.from_dict(result), handle.job_id)

    def cancel(self, handle: Handle) -> None:
        pass

    def reattach(self, job_id: str, job: TrialJob) -> Handle:
        return Handle(job_id, job)  # answers are instant and repeatable


def _norm(v: Any) -> Any:
    """Table cells as comparable Python values (numpy scalars, 'True' strings from CSV)."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _times(v: Any) -> list[float] | None:
    """A table's step times: a list (Parquet), or its text in a CSV cell (`[0.5, 0.5]`, as pandas
    writes it); None when the cell is neither."""
    try:
        values = json.loads(v) if isinstance(v, str) else v
        return [float(x) for x in values]
    except (TypeError, ValueError):
        return None


def _known(v: Any) -> bool:
    """A table cell that holds a value (not an empty CSV cell, read as NaN)."""
    return not (isinstance(v, float) and math.isnan(v)) and v is not None


def _clean(v: Any) -> Any:
    if hasattr(v, "tolist"):
        v = v.tolist()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v
