"""A results folder with broken files, and a disk that fills while a result is written."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from sweeper.errors import SweepError
from sweeper.results.rows import ResultsStore
from tests.faults.helpers import spec_file, sweep


def fake_row(n: int, mfu: float) -> dict:
    return {
        "trial_number": n,
        "status": "ok",
        "tp": 1,
        "pp": 1,
        "micro_batch_size": 1 + n,
        "mfu": mfu,
        "launcher": "local",
        "optuna_trial": n,
        "attempt": 1,
    }


def test_truncated_and_foreign_parquet_are_named_and_skipped(tmp_path: Path):
    spec = spec_file(tmp_path, "broken")
    store = ResultsStore(tmp_path / "results" / "broken")
    store.ensure()
    good = [store.write_row(fake_row(n, mfu)) for n, mfu in ((0, 0.1), (1, 0.3))]
    data = good[0].read_bytes()
    truncated = store.trials_dir / "trial-00007.parquet"
    truncated.write_bytes(data[: len(data) // 2])
    foreign = store.trials_dir / "trial-00008.parquet"
    pd.DataFrame({"city": ["Lyon"], "population": [522_000]}).to_parquet(foreign)
    garbage = store.trials_dir / "trial-00009.parquet"
    garbage.write_bytes(b"not parquet at all")
    best = sweep("best", str(spec), "--format", "json", cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["best"]["trial_number"] == 1
    status = sweep("status", str(spec), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    for out in (best.stderr, status.stderr):
        flat = " ".join(out.split())
        for bad in (truncated, foreign, garbage):
            assert bad.name in flat, out
        assert "Traceback" not in out
    assert [r["trial_number"] for r in ResultsStore(store.root).rows()] == [0, 1]


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 512 KiB file system (tmpfs, root only)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)]).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_is_a_clear_error_and_loses_nothing(small_disk: Path):
    store = ResultsStore(small_disk / "sweep")
    store.ensure()
    written = [store.write_row(fake_row(n, 0.1)) for n in range(3)]
    filler = small_disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:  # fill the file system to the last byte
        for size in (65536, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    with pytest.raises(SweepError) as e:
        for n in range(3, 50):
            store.write_row(fake_row(n, 0.2))
    msg = str(e.value)
    assert "No space left on device" in msg and "trial-000" in msg and "intact" in msg, msg
    assert not [p.name for p in store.trials_dir.iterdir() if p.name.startswith(".")]  # no temp file left
    rows = store.rows()
    assert not store.warnings and [r["trial_number"] for r in rows][:3] == [0, 1, 2]
    assert all(p.exists() for p in written)
    with pytest.raises(SweepError, match="in-flight record"):
        store.record_inflight(99, {"job_id": "local-1"})
    filler.unlink()  # space again: writing goes on where it stopped
    store.write_row(fake_row(len(rows), 0.4))
    assert len(store.rows()) == len(rows) + 1
