"""Results: one Parquet file per trial, atomic, typed, readable whole by pandas; bad files skipped."""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sweeper.results.rows import COLUMNS, ResultsStore, best_rows, now_utc


def _row(n: int, status: str = "ok", mfu: float | None = 0.5) -> dict:
    return {
        "trial_number": n,
        "status": status,
        "tp": 2,
        "pp": 1,
        "micro_batch_size": 1,
        "sequence_parallel": False,
        "activation_checkpointing": "none",
        "attention": "flash2",
        "rmsnorm": "eager",
        "mfu": mfu,
        "step_times_s": [1.0, 0.5, 0.5],
        "error": None if status == "ok" else "CUDA out of memory",
        "started_at": now_utc(),
        "finished_at": now_utc(),
    }


def test_rows_round_trip_and_pandas_reads_the_dataset(tmp_path):
    store = ResultsStore(tmp_path / "s")
    store.ensure()
    store.write_row(_row(0, "oom", None))  # a first file of failures still has typed columns
    store.write_row(_row(1, "ok", 0.61))
    df = pd.read_parquet(store.trials_dir)
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 2 and df.mfu.isna().tolist() == [True, False]
    assert list(df.sort_values("trial_number").step_times_s.iloc[1]) == [1.0, 0.5, 0.5]
    assert df.sweep_version.notna().all() and df.python_version.notna().all()
    assert not [p for p in store.trials_dir.iterdir() if p.name.startswith(".")]


def test_a_finished_trial_is_never_rewritten(tmp_path):
    store = ResultsStore(tmp_path)
    store.ensure()
    store.write_row(_row(3))
    with pytest.raises(FileExistsError):
        store.write_row(_row(3))


def test_unknown_column_is_an_error(tmp_path):
    store = ResultsStore(tmp_path)
    store.ensure()
    with pytest.raises(KeyError, match="mfu_percent"):
        store.write_row(_row(0) | {"mfu_percent": 50})


def test_truncated_and_foreign_files_are_reported_and_skipped(tmp_path):
    store = ResultsStore(tmp_path)
    store.ensure()
    store.write_row(_row(0))
    good = store.trial_path(0).read_bytes()
    store.trial_path(1).write_bytes(good[: len(good) // 2])  # truncated
    pq.write_table(pa.table({"x": [1]}), store.trials_dir / "foreign.parquet")
    rows = store.rows()
    assert [r["trial_number"] for r in rows] == [0]
    assert len(store.warnings) == 2
    assert any("trial-00001" in w for w in store.warnings) and any("foreign" in w for w in store.warnings)


def test_inflight_records_and_next_number(tmp_path):
    store = ResultsStore(tmp_path)
    store.ensure()
    store.write_row(_row(0))
    store.record_inflight(
        1, {"trial_number": 1, "job_id": "123", "optuna_trial": 1, "row": 0, "attempt": 1, "layout": {"tp": 1}}
    )
    assert store.next_trial_number() == 2
    assert store.inflight()[0]["job_id"] == "123"
    store.clear_inflight(1)
    assert store.inflight() == [] and store.next_trial_number() == 1


def test_best_rows_orders_by_mfu_and_ignores_failures():
    rows = [_row(0, "ok", 0.4), _row(1, "oom", None), _row(2, "ok", 0.6), _row(3, "ok", 0.6)]
    assert [r["trial_number"] for r in best_rows(rows, 2)] == [2, 3]


def test_polars_reads_trials_while_a_result_is_being_written(tmp_path, monkeypatch):
    """The temp file of a result in progress lives outside trials/ (Polars refuses a folder with
    mixed file extensions, e.g. `x.parquet` beside `.x.parquet.tmp`)."""
    import polars as pl  # in the test extra

    from sweeper.results import rows as results

    store = ResultsStore(tmp_path)
    store.ensure()
    store.write_row(_row(0, "ok", 0.4))
    seen: list[tuple[int, list[str]]] = []
    real_write = results.pq.write_table

    def write_then_read(table, where, *args, **kwargs):
        real_write(table, where, *args, **kwargs)  # the temp file now exists on disk, not yet renamed
        assert where.exists() and where.parent != store.trials_dir
        seen.append((pl.read_parquet(store.trials_dir).height, sorted(p.name for p in store.trials_dir.iterdir())))

    monkeypatch.setattr(results.pq, "write_table", write_then_read)
    store.write_row(_row(1, "oom", None))
    assert seen == [(1, ["trial-00000.parquet"])]
    assert pl.read_parquet(store.trials_dir)["status"].to_list() == ["ok", "oom"]
