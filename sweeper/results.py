"""The results of a sweep: one Parquet file per finished trial, written atomically, never rewritten.

`results/<name>/trials/` is a Parquet dataset (`pandas.read_parquet` reads it whole); every file
has the same explicit schema, so a value that could not be measured is null, never 0, and a
dataset of only failures still has typed columns.
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import sweeper
from sweeper.errors import SweepError
from sweeper.knobs import KNOBS

_ARROW = {int: pa.int64(), bool: pa.bool_(), str: pa.string()}

SCHEMA = pa.schema(
    [pa.field("trial_number", pa.int64(), nullable=False), pa.field("status", pa.string(), nullable=False)]
    + [pa.field(k, _ARROW[knob.kind]) for k, knob in KNOBS.items()]
    + [
        pa.field("dp", pa.int64()),
        pa.field("grad_accum", pa.int64()),
        pa.field("num_devices", pa.int64()),
        pa.field("mfu", pa.float64()),
        pa.field("hfu", pa.float64()),
        pa.field("tflops_per_gpu", pa.float64()),
        pa.field("tokens_per_s", pa.float64()),
        pa.field("tokens_per_s_per_gpu", pa.float64()),
        pa.field("step_times_s", pa.list_(pa.float64())),
        pa.field("step_time_mean_s", pa.float64()),
        pa.field("step_time_std_s", pa.float64()),
        pa.field("losses", pa.list_(pa.float64())),
        pa.field("startup_s", pa.float64()),
        pa.field("pred_mem_gib", pa.float64()),
        pa.field("peak_mem_gib", pa.float64()),
        pa.field("peak_mem_reserved_gib", pa.float64()),
        pa.field("peak_mem_steady_gib", pa.float64()),
        pa.field("error", pa.string()),
        pa.field("job_id", pa.string()),
        pa.field("nodelist", pa.string()),
        pa.field("log_path", pa.string()),
        pa.field("launcher", pa.string()),
        pa.field("device", pa.string()),
        pa.field("attempt", pa.int64()),
        pa.field("optuna_trial", pa.int64()),
        pa.field("started_at", pa.timestamp("us", tz="UTC")),
        pa.field("finished_at", pa.timestamp("us", tz="UTC")),
        pa.field("torch_version", pa.string()),
        pa.field("cuda_version", pa.string()),
        pa.field("nccl_version", pa.string()),
        pa.field("gpu_name", pa.string()),
        pa.field("python_version", pa.string()),
        pa.field("sweep_version", pa.string()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def row_from(values: Mapping[str, Any]) -> dict[str, Any]:
    """A row with every column of the schema; unknown keys are an error (a typo, not data)."""
    unknown = set(values) - set(COLUMNS)
    if unknown:
        raise KeyError(f"not result columns: {sorted(unknown)}")
    row = {c: values.get(c) for c in COLUMNS}
    row["python_version"] = row["python_version"] or platform.python_version()
    row["sweep_version"] = row["sweep_version"] or sweeper.__version__
    return row


@dataclass
class ResultsStore:
    """The results folder of one sweep: trial rows, in-flight records, the study, the lock."""

    root: Path
    warnings: list[str] = field(default_factory=list)

    @property
    def trials_dir(self) -> Path:
        return self.root / "trials"

    @property
    def inflight_dir(self) -> Path:
        return self.root / "inflight"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def ensure(self) -> None:
        for d in (self.trials_dir, self.inflight_dir, self.jobs_dir):
            d.mkdir(parents=True, exist_ok=True)

    # ---- finished trials -------------------------------------------------------------
    def trial_path(self, number: int) -> Path:
        return self.trials_dir / f"trial-{number:05d}.parquet"

    def write_row(self, values: Mapping[str, Any]) -> Path:
        """Write one finished trial: temp file, fsync, rename. Readers never see a partial file."""
        row = row_from(values)
        path = self.trial_path(int(row["trial_number"]))
        if path.exists():
            raise FileExistsError(f"{path} exists: a finished trial is never rewritten")
        table = pa.Table.from_pylist([row], schema=SCHEMA)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # leading dot: datasets skip it
        try:
            pq.write_table(table, tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:  # a full disk, a quota, a read-only mount: the user's to fix
            raise _write_error(f"the result of trial {row['trial_number']}", path, e) from None
        finally:
            tmp.unlink(missing_ok=True)
        _fsync_dir(self.trials_dir)
        return path

    def rows(self) -> list[dict[str, Any]]:
        """Every finished trial, in trial order; unreadable or foreign files are reported and skipped."""
        out = []
        if not self.trials_dir.is_dir():
            return out
        for path in sorted(self.trials_dir.glob("*.parquet")):
            try:
                table = pq.read_table(path)
                missing = {"trial_number", "status"} - set(table.column_names)
                if missing:
                    raise ValueError(f"missing columns {sorted(missing)}")
            except Exception as e:  # noqa: BLE001 - any unreadable file is skipped, by name
                self.warnings.append(f"skipped {path}: {' '.join(str(e).split())[:200]}")
                continue
            out.extend(table.to_pylist())
        out.sort(key=lambda r: r["trial_number"])
        return out

    def frame(self) -> Any:
        """The finished trials as a pandas DataFrame with the full schema (empty when none)."""
        rows = [{c: r.get(c) for c in COLUMNS} for r in self.rows()]
        return pa.Table.from_pylist(rows, schema=SCHEMA).to_pandas()

    # ---- trials in flight ------------------------------------------------------------
    def record_inflight(self, number: int, record: Mapping[str, Any]) -> None:
        """Persist a submitted trial (its job id above all) before waiting on it, for re-attach."""
        path = self.inflight_dir / f"trial-{number:05d}.json"
        try:
            _atomic_write_text(path, json.dumps(dict(record), default=str))
        except OSError as e:
            raise _write_error(f"the in-flight record of trial {number} (job {record.get('job_id')})", path, e) from None

    def inflight(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.inflight_dir.glob("trial-*.json")):
            try:
                out.append(json.loads(path.read_text()))
            except (OSError, ValueError) as e:
                self.warnings.append(f"skipped {path}: {e}")
        return out

    def clear_inflight(self, number: int) -> None:
        (self.inflight_dir / f"trial-{number:05d}.json").unlink(missing_ok=True)

    def next_trial_number(self) -> int:
        numbers = [int(p.stem.split("-")[1]) for p in self.trials_dir.glob("trial-*.parquet")]
        numbers += [int(r["trial_number"]) for r in self.inflight()]
        return max(numbers, default=-1) + 1


def _write_error(what: str, path: Path, e: OSError) -> SweepError:
    return SweepError(
        f"cannot write {what} to {path}: {e.strerror or e}; the results already written are intact. "
        "Free the space (or fix the folder) and run `sweep run` again: it picks up where it stopped"
    )


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def best_rows(rows: Iterable[Mapping[str, Any]], top: int) -> list[Mapping[str, Any]]:
    """The `top` ok trials by MFU, best first (ties: the earlier trial)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("mfu") is not None]
    return sorted(ok, key=lambda r: (-r["mfu"], r["trial_number"]))[:top]
