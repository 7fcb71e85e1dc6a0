"""The results of a sweep: one Parquet file per finished trial, written atomically, never rewritten.

`results/<name>/trials/` is a Parquet dataset (`pandas.read_parquet` reads it whole); every file
has the same explicit schema, so a value that could not be measured is null, never 0, and a
dataset of only failures still has typed columns.
"""

from __future__ import annotations

import json
import platform
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import sweeper
from sweeper.errors import SweepError
from sweeper.files import atomic_write, atomic_write_text
from sweeper.folder import INFLIGHT_FILE, PRIVATE_DIR, trial_number_of
from sweeper.spec import Sweep
from sweeper.statuses import TrialStatus
from sweeper.trial import TrialResult


@dataclass
class TrialRecord:
    """What the sweep adds to a trial's `TrialResult` in its row: identity, bookkeeping, the estimate."""

    trial_number: int
    pred_mem_gib: float | None = None
    job_id: str | None = None
    nodelist: str | None = None
    log_path: str | None = None
    launcher: str | None = None
    attempt: int | None = None
    optuna_trial: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    sweep_version: str | None = None
    sweep_id: str | None = None  # sweeper.identity.sweep_identity of the sweep that ran it
    gpu_hours_saved: float | None = None  # stopped early: GPU-hours of the steps it did not run
    nodes: int | None = None  # the node count the trial ran on (cluster.nodes, or one of its list)


@dataclass(frozen=True)
class InFlight:
    """A submitted trial, persisted before anything waits on it, so a later `sweep run` re-attaches.

    Stored as JSON in `inflight/trial-NNNNN.json` with these field names.
    """

    trial_number: int
    optuna_trial: int
    row: int  # the plan row it runs
    attempt: int
    job_id: str | None  # None between saving the record and the launcher starting the job
    layout: dict[str, Any]
    submitted_at: str  # ISO 8601, UTC
    started_at: str  # of the first attempt
    previous_error: str | None = None  # why attempt 1 ended, on the retry

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InFlight:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


_ARROW: dict[Any, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    str: pa.string(),
    TrialStatus: pa.string(),
    list[float]: pa.list_(pa.float64()),
    datetime: pa.timestamp("us", tz="UTC"),
}


def _arrow_fields(cls: type, *, required: tuple[str, ...]) -> list[pa.Field]:
    """One Arrow field per dataclass field, typed from its annotation (`X | None` is a nullable X)."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in fields(cls):
        hint = hints[f.name]
        if isinstance(hint, types.UnionType):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        out.append(pa.field(f.name, _ARROW[hint], nullable=f.name not in required))
    return out


# One column per field: the row's identity first, then the trial's result, then the sweep's bookkeeping.
SCHEMA = pa.schema(
    _arrow_fields(TrialRecord, required=("trial_number",))[:1]
    + _arrow_fields(TrialResult, required=("status",))
    + _arrow_fields(TrialRecord, required=())[1:]
)
COLUMNS: tuple[str, ...] = tuple(SCHEMA.names)


def now_utc() -> datetime:
    return datetime.now(UTC)


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
    identity: str | None = None  # when set, rows of another sweep are skipped (and listed in `foreign`)
    foreign: list[Path] = field(default_factory=list)

    def _warn(self, message: str) -> None:
        if message not in self.warnings:  # rows() may be read more than once per run
            self.warnings.append(message)

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
            try:
                d.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
            except OSError as e:
                raise SweepError(f"results_dir: cannot create {d}: {e.strerror or e}") from None

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
        try:
            # written in .tmp/ and renamed in: Polars and DuckDB read trials/ while a sweep runs
            atomic_write(path, lambda tmp: pq.write_table(table, tmp), tmp_dir=self.root / ".tmp")
        except OSError as e:  # a full disk, a quota, a read-only mount: the user's to fix
            raise _write_error(f"the result of trial {row['trial_number']}", path, e) from None
        return path

    def rows(self) -> list[dict[str, Any]]:
        """Every finished trial, in trial order; unreadable or foreign files are reported and skipped:
        only the tool's own names (`trial-NNNNN.parquet`) are read, and with an `identity`, only
        rows of that sweep."""
        out: list[dict[str, Any]] = []
        self.foreign = []
        if not self.trials_dir.is_dir():
            return out
        for path in sorted(self.trials_dir.iterdir()):
            if path.name.startswith("."):
                continue  # an atomic write's temp file
            if path.is_symlink():  # nothing under a results folder is followed through a link
                self._warn(f"skipped {path}: a symbolic link, not followed")
                continue
            if trial_number_of(path.name) is None:
                self._warn(f"skipped {path}: not a result file of the sweep (trial-NNNNN.parquet)")
                continue
            try:
                table = pq.read_table(path)
                missing = {"trial_number", "status"} - set(table.column_names)
                if missing:
                    raise ValueError(f"missing columns {sorted(missing)}")
            except Exception as e:  # noqa: BLE001 - any unreadable file is skipped, by name
                self._warn(f"skipped {path}: {' '.join(str(e).split())[:200]}")
                continue
            rows = table.to_pylist()
            if self.identity is not None and any(r.get("sweep_id") not in (None, self.identity) for r in rows):
                self.foreign.append(path)
                found = rows[0].get("sweep_id") if rows else None
                self._warn(f"skipped {path}: a row of another sweep (sweep_id {found}, this sweep {self.identity})")
                continue
            out.extend(rows)
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
            atomic_write_text(path, json.dumps(dict(record), default=str))
        except OSError as e:
            raise _write_error(
                f"the in-flight record of trial {number} (job {record.get('job_id')})", path, e
            ) from None

    def inflight(self) -> list[dict[str, Any]]:
        """The in-flight records; a file that is not one (bad name, not JSON, `{}`) is skipped by name."""
        out: list[dict[str, Any]] = []
        if not self.inflight_dir.is_dir():
            return out
        for path in sorted(self.inflight_dir.iterdir()):
            if path.name.startswith("."):
                continue
            m = INFLIGHT_FILE.match(path.name)
            try:
                if path.is_symlink():  # nothing under a results folder is followed through a link
                    raise ValueError("a symbolic link, not followed")
                if m is None:
                    raise ValueError("not an in-flight record of the sweep (trial-NNNNN.json)")
                rec = json.loads(path.read_text())
                _check_record(rec, int(m.group(1)))
            except (OSError, ValueError, TypeError) as e:
                self._warn(f"skipped {path}: {' '.join(str(e).split())[:200]}")
                continue
            out.append(rec)
        return out

    def clear_inflight(self, number: int) -> None:
        (self.inflight_dir / f"trial-{number:05d}.json").unlink(missing_ok=True)

    def next_trial_number(self) -> int:
        numbers = [n for p in self.trials_dir.glob("trial-*.parquet") if (n := trial_number_of(p.name)) is not None]
        # by file name, so that even an unreadable record's number is never given out again
        numbers += [
            int(m.group(1)) for p in self.inflight_dir.glob("trial-*.json") if (m := INFLIGHT_FILE.match(p.name))
        ]
        return max(numbers, default=-1) + 1


_RECORD_FIELDS = {"trial_number": int, "optuna_trial": int, "row": int, "attempt": int, "layout": dict}


def _check_record(rec: Any, number: int) -> None:
    """An in-flight record as `orchestrator._submit` writes it, for the trial its name says."""
    if not isinstance(rec, dict):
        raise ValueError(f"expected a JSON object, got {type(rec).__name__}")
    for key, kind in _RECORD_FIELDS.items():
        if not isinstance(rec.get(key), kind) or isinstance(rec.get(key), bool):
            raise ValueError(f"field {key!r} missing or not {kind.__name__}")
    if rec.get("job_id") is not None and not isinstance(rec["job_id"], str):
        raise ValueError("field 'job_id' is not a string")
    if rec["trial_number"] != number:
        raise ValueError(f"names trial {rec['trial_number']}, its file name trial {number}")


def _write_error(what: str, path: Path, e: OSError) -> SweepError:
    return SweepError(
        f"cannot write {what} to {path}: {e.strerror or e}; the results already written are intact. "
        "Free the space (or fix the folder) and run `sweep run` again: it picks up where it stopped"
    )


def best_rows(rows: Iterable[Mapping[str, Any]], top: int) -> list[Mapping[str, Any]]:
    """The `top` ok trials by MFU, best first (ties: the earlier trial)."""
    ok = [r for r in rows if r.get("status") == TrialStatus.OK and r.get("mfu") is not None]
    return sorted(ok, key=lambda r: (-r["mfu"], r["trial_number"]))[:top]


def open_results(spec: str, results: Path | None) -> tuple[Path, ResultsStore]:
    """The results folder (given, or the sweep's) and its store; a user error when it has none."""
    from sweeper.identity import sweep_identity
    from sweeper.spec import load_sweep

    sweep = load_sweep(spec) if results is None else None
    root = results or sweep.results_path  # type: ignore[union-attr]
    if not (root / "trials").is_dir():
        raise SweepError(f"no results under {root} (run `sweep run {spec}` first)")
    if sweep is None and (root / "sweep.yaml").is_file():
        sweep = load_sweep(root / "sweep.yaml")
    # rows of another sweep (a copied file) are skipped with a warning, never ranked
    return root, ResultsStore(root, identity=sweep_identity(sweep) if sweep is not None else None)


def sweep_as_run(root: Path, spec: str) -> Sweep:
    """The sweep as it was run (`sweep.yaml` beside the results), else the sweep file named."""
    from sweeper.spec import load_sweep

    as_run = root / "sweep.yaml"
    return load_sweep(as_run if as_run.is_file() else spec)
