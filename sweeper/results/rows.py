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
from sweeper.errors import SweepError, one_line
from sweeper.files import FileRefused, atomic_write, atomic_write_text, parse_json, read_limited
from sweeper.results.folder import INFLIGHT_FILE, PRIVATE_DIR, check_readable_folder, trial_number_of
from sweeper.results.trial import TrialResult, as_failed, impossible
from sweeper.spec.sweep import Sweep
from sweeper.statuses import TrialStatus


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
    sweep_id: str | None = None  # sweeper.results.identity.sweep_identity of the sweep that ran it
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
    # when set, a row of another node count is skipped, by name: `nodes` edited in a row file to a
    # size the sweep never ran would be ranked (and exported) as one it measured
    node_counts: tuple[int, ...] | None = None
    # when set (the sweep's space), a row whose layout is outside it is skipped, by name: `tp` edited
    # to 1000000 would otherwise be ranked best and exported
    space: Mapping[str, tuple[Any, ...]] | None = None

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
        """Every finished trial, in trial order; unreadable, malformed or foreign files are reported and
        skipped: only the tool's own names (`trial-NNNNN.parquet`) are read, each must hold one row with
        the schema's types (`row_problem`), with an `identity` of that sweep, of the trial its name
        says; of two files of one trial the second is left out."""
        out: dict[int, dict[str, Any]] = {}
        self.foreign = []
        if not self.trials_dir.is_dir():
            return []
        for path in sorted(self.trials_dir.iterdir(), key=_own_name_first):
            if path.name.startswith("."):
                continue  # an atomic write's temp file
            if path.is_symlink():  # nothing under a results folder is followed through a link
                self._warn(f"skipped {path}: a symbolic link, not followed")
                continue
            number = trial_number_of(path.name)
            if number is None:
                self._warn(f"skipped {path}: not a result file of the sweep (trial-NNNNN.parquet)")
                continue
            try:
                table = read_row_file(path)
            except FileRefused as e:
                self._warn(f"skipped {e}")
                continue
            except Exception as e:  # noqa: BLE001 - any unreadable file is skipped, by name
                self._warn(f"skipped {path}: {' '.join(str(e).split())[:200]}")
                continue
            problem = row_problem(table)
            if problem is not None:
                self._warn(f"skipped {path}: {problem}")
                continue
            row = table.to_pylist()[0]
            if self.identity is not None and row.get("sweep_id") not in (None, self.identity):
                self.foreign.append(path)
                self._warn(
                    f"skipped {path}: a row of another sweep (sweep_id {row['sweep_id']}, this sweep {self.identity})"
                )
                continue
            if row["trial_number"] != number:
                self._warn(
                    f"skipped {path}: field 'trial_number' is {row['trial_number']}, its file name trial {number}'s"
                )
                continue
            if number in out:
                self._warn(f"skipped {path}: a second file of trial {number} ({self.trial_path(number).name} is read)")
                continue
            nodes = row.get("nodes")
            if self.node_counts is not None and nodes is not None and nodes not in self.node_counts:
                counts = ", ".join(map(str, self.node_counts))
                self._warn(f"skipped {path}: nodes {nodes} is not a node count of the sweep ({counts})")
                continue
            if self.space is not None and (outside := outside_space(row, self.space)) is not None:
                self._warn(f"skipped {path}: {outside}")
                continue
            if (why := impossible(row)) is not None:  # written before such rows were refused: never learned from
                self._warn(f"read {path} as failed: impossible numbers: {why}")
                row = as_failed(row, why)
            out[number] = row
        return [out[n] for n in sorted(out)]

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
                rec = parse_json(read_limited(path, max_bytes=MAX_INFLIGHT_BYTES), path)
                _check_record(rec, int(m.group(1)))
            except (OSError, ValueError, TypeError, FileRefused) as e:
                why = str(e).removeprefix(f"{path}: ")
                self._warn(f"skipped {path}: {' '.join(why.split())[:200]}")
                continue
            out.append(rec)
        return out

    def clear_inflight(self, number: int) -> None:
        (self.inflight_dir / f"trial-{number:05d}.json").unlink(missing_ok=True)

    def numbers(self) -> set[int]:
        """The trial numbers given out: of every row and in-flight record, by file name, so that even an
        unreadable one's number is never given out again."""
        numbers = {n for p in self.trials_dir.glob("trial-*.parquet") if (n := trial_number_of(p.name)) is not None}
        return numbers | {
            int(m.group(1)) for p in self.inflight_dir.glob("trial-*.json") if (m := INFLIGHT_FILE.match(p.name))
        }

    def next_trial_number(self) -> int:
        return max(self.numbers(), default=-1) + 1


def outside_space(row: Mapping[str, Any], space: Mapping[str, tuple[Any, ...]]) -> str | None:
    """Why a row's layout is not one of the sweep's (a knob's value outside its space); None when it is."""
    from sweeper.knobs import KNOBS

    for knob, values in space.items():
        v = row.get(knob)
        follows = KNOBS[knob].follows if knob in KNOBS else ""
        # a knob that follows another (etp follows tp) holds that knob's value where left at its default
        allowed = (*values, row.get(follows)) if follows and KNOBS[knob].default in values else values
        if v is not None and not any(v == x and type(v) is type(x) for x in allowed):
            shown = ", ".join(map(str, values))
            return f"{knob} {one_line(repr(v), 40)} is not in the sweep's space ({knob}: {shown})"
    return None


def read_row_file(path: Path) -> pa.Table:
    """One row file, bounded before it is decoded: a regular file of at most MAX_ROW_BYTES (a FIFO or
    device is refused without blocking), decoded under MAX_ROW_BYTES by what its pages and strings
    hold, not by what its footer says (`sweeper.parquet_bound`). `row_problem` then judges its content."""
    from sweeper.results.parquet_bound import read_parquet_bounded

    return read_parquet_bounded(read_limited(path, max_bytes=MAX_ROW_BYTES), path, max_decoded=MAX_ROW_BYTES)


def row_problem(table: pa.Table) -> str | None:
    """Why a result file is not one row of the schema (a field missing or of another type, a status
    that is none, two rows), None when it is one: columns the schema has since gained may be
    missing, and a narrower number (int32) is a number."""
    missing = [c for c in ("trial_number", "status") if c not in table.column_names]
    if missing:
        return f"field {missing[0]!r} is missing"
    for f in table.schema:
        if f.name in COLUMNS and not _fits(f.type, SCHEMA.field(f.name).type):
            return f"field {f.name!r} is {f.type}, not {SCHEMA.field(f.name).type}"
    if table.num_rows != 1:
        return f"it holds {table.num_rows} rows; a result file holds one trial's row"
    row = table.to_pylist()[0]
    if row["trial_number"] is None:
        return "field 'trial_number' is empty"
    if row["status"] not in TrialStatus.__members__.values():
        allowed = ", ".join(TrialStatus)
        return f"field 'status' is {row['status']!r}, not a trial status ({allowed})"
    return None


def _fits(found: pa.DataType, expected: pa.DataType) -> bool:
    """A column type that reads as the schema's: the same kind (a number, a string, a time, a list of numbers)."""
    if found == expected or pa.types.is_null(found):
        return True
    kinds = (
        (pa.types.is_integer, (pa.types.is_integer,)),
        (pa.types.is_floating, (pa.types.is_integer, pa.types.is_floating)),
        (pa.types.is_string, (pa.types.is_string, pa.types.is_large_string)),
        (pa.types.is_timestamp, (pa.types.is_timestamp,)),
        (pa.types.is_boolean, (pa.types.is_boolean,)),
    )
    for is_kind, accepted in kinds:
        if is_kind(expected):
            return any(a(found) for a in accepted)
    if pa.types.is_list(expected) and (pa.types.is_list(found) or pa.types.is_large_list(found)):
        return _fits(found.value_type, expected.value_type)
    return False


def _own_name_first(path: Path) -> tuple[int, str]:
    """The tool's own names (`trial-00007.parquet`) before any other spelling of a number
    (`trial-000007.parquet`), so that of two files of one trial the other spelling is left out."""
    number = trial_number_of(path.name)
    own = number is not None and path.name == f"trial-{number:05d}.parquet"
    return (0 if own else 1, path.name)


MAX_INFLIGHT_BYTES = 1 << 20  # an in-flight record is a few hundred bytes
MAX_ROW_BYTES = 16 << 20  # a trial's row is kilobytes (its step times, a log's last lines)
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


def no_results_message(root: Path, spec: str, option: str, *, given: bool) -> str:
    """No results folder at `root`: run the sweep first, or (the sweep's own folder, which
    `results_dir` makes relative to where the command runs) name the folder with `option`."""
    if given:
        return f"no results under {root} ({option} names a sweep's results folder, with trials/ in it)"
    where = f" (results_dir is relative to this folder, {Path.cwd()})" if not root.is_absolute() else ""
    return f"no results under {root}{where}: run `sweep run {spec}` first, or give the results folder with {option} DIR"


def open_results(spec: str, results: Path | None, *, option: str = "--results") -> tuple[Path, ResultsStore]:
    """The results folder (given, or the sweep's) and its store; a user error, naming the command's
    `option` for a folder, when it has none."""
    from sweeper.results.identity import sweep_identity
    from sweeper.spec.loader import load_sweep

    # the sweep file names the folder; its measured profile prices nothing here (and may be gone)
    sweep = load_sweep(spec, profiles=False) if results is None else None
    root = results or sweep.results_path  # type: ignore[union-attr]
    check_readable_folder(root)
    if not (root / "trials").is_dir():
        raise SweepError(no_results_message(root, spec, option, given=results is not None))
    if sweep is None and (root / "sweep.yaml").is_file():
        sweep = load_sweep(root / "sweep.yaml", profiles=False)
    # rows of another sweep (a copied file) or of a node count it never ran are skipped with a warning, never ranked
    identity = sweep_identity(sweep) if sweep is not None else None
    return root, ResultsStore(
        root,
        identity=identity,
        node_counts=sweep.node_counts if sweep is not None else None,
        space=sweep.space if sweep is not None else None,
    )


def sweep_as_run(root: Path, spec: str) -> Sweep:
    """The sweep as it was run (`sweep.yaml` beside the results), else the sweep file named."""
    from sweeper.spec.loader import load_sweep

    as_run = root / "sweep.yaml"
    return load_sweep(as_run if as_run.is_file() else spec)
