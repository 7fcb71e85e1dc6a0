"""Issue 27, 1 and 8 and a rebuild's states: the study mirrors the sweep, one Optuna trial per sweep
trial with the sweep's number, after a kill or a full disk at the in-flight record, after
`--rebuild-study` over an unreadable row, and a study that is not this sweep's is refused.

Trials are answered by the replay launcher (a real launcher, no processes); the faults are placed at
one exact moment in a real `sweep run` (tests.faults.helpers.sweep_placed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pandas as pd
import pytest

from tests.faults.helpers import sweep, sweep_placed
from tests.faults.test_hardening import one_line_error, replay_spec

ROOT_ONLY = pytest.mark.skipif(__import__("os").geteuid() != 0, reason="mounting a small tmpfs needs root")
RECORD = "sweeper.results.rows:ResultsStore.record_inflight"  # called twice per trial: before and after the job starts
STUDY_TRIAL = "optuna.storages._cached_storage:_CachedStorage.create_new_trial"  # the study's new trial


def study_of(root: Path, name: str = "ex") -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{root / 'optuna.db'}").get_trials(deepcopy=False)


def assert_numbered_alike(root: Path, *, rows: int) -> pd.DataFrame:
    """As many study trials as rows, each row's Optuna trial its own number, that trial's state its row's."""
    df = pd.read_parquet(root / "trials").sort_values("trial_number")
    trials = study_of(root)
    assert len(df) == rows, df
    assert df.trial_number.tolist() == list(range(rows)), df.trial_number.tolist()
    assert df.optuna_trial.tolist() == df.trial_number.tolist(), df[["trial_number", "optuna_trial"]]
    assert [t.number for t in trials] == list(range(rows)), [(t.number, t.state.name) for t in trials]
    assert [t.user_attrs.get("trial_number") for t in trials] == list(range(rows))
    assert [t.state.name for t in trials] == ["COMPLETE" if s == "ok" else "FAIL" for s in df.status]
    return df


@pytest.mark.parametrize(
    "target, call, action",
    [
        (STUDY_TRIAL, 3, "kill-after"),  # trial 2: the study's trial made, its in-flight record not yet complete
        (RECORD, 5, "kill-before"),  # trial 2: before its first in-flight record
    ],
)
def test_a_kill_around_the_in_flight_record_keeps_the_study_numbered_like_the_sweep(
    tmp_path: Path, target: str, call: int, action: str
):
    spec = replay_spec(tmp_path)
    root = tmp_path / "results" / "ex"
    killed = sweep_placed(target, "run", str(spec), call=call, action=action, cwd=tmp_path)
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert len(list((root / "trials").glob("*.parquet"))) == 2
    r = sweep("run", str(spec), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert_numbered_alike(root, rows=4)


@ROOT_ONLY
def test_a_full_disk_at_the_in_flight_record_keeps_the_study_numbered_like_the_sweep(tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs")
    try:
        spec = replay_spec(tmp_path, results_dir=str(disk / "results"))
        root = disk / "results" / "ex"
        filler = disk / "filler"
        full = sweep_placed(RECORD, "run", str(spec), call=5, action="fill-disk", fill=filler, cwd=tmp_path)
        msg = one_line_error(full)
        assert "in-flight record of trial 2" in msg and "No space left on device" in msg, msg
        filler.unlink()
        r = sweep("run", str(spec), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert_numbered_alike(root, rows=4)
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def replay_table(spec: Path, rows: list[dict]) -> None:
    """Answer the sweep `spec` from these rows instead of ROWS (its CSV beside it)."""
    pd.DataFrame(rows).to_csv(spec.with_suffix(".csv"), index=False)


MIXED = [  # one of each study state: COMPLETE, FAIL (an OOM), PRUNED (stopped early)
    {"tp": 1, "pp": 1, "micro_batch_size": 1, "status": "ok", "mfu": 0.3},
    {"tp": 1, "pp": 2, "micro_batch_size": 1, "status": "oom", "mfu": None, "error": "CUDA out of memory"},
    {"tp": 2, "pp": 1, "micro_batch_size": 1, "status": "stopped_early", "mfu": 0.2},
    {"tp": 2, "pp": 2, "micro_batch_size": 1, "status": "ok", "mfu": 0.6},
]


def test_rebuilding_a_healthy_study_keeps_each_trials_state_and_attributes(tmp_path: Path):
    spec = replay_spec(tmp_path)
    replay_table(spec, MIXED)
    root = tmp_path / "results" / "ex"
    assert sweep("run", str(spec), cwd=tmp_path).returncode == 0
    told = [(t.number, t.state.name, t.value, t.params, t.user_attrs) for t in study_of(root)]
    assert sorted(s for _, s, _, _, _ in told) == ["COMPLETE", "COMPLETE", "FAIL", "PRUNED"], told
    r = sweep("run", str(spec), "--rebuild-study", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    rebuilt = [(t.number, t.state.name, t.value, t.params, t.user_attrs) for t in study_of(root)]
    assert [a.pop("kind") for *_, a in rebuilt] == ["rebuilt"] * 4
    assert rebuilt == told
    assert len(list((root / "trials").glob("*.parquet"))) == 4  # nothing rerun


def test_a_rebuild_over_an_unreadable_row_keeps_the_study_numbered_like_the_sweep(tmp_path: Path):
    spec = replay_spec(tmp_path, search={"max_trials": 3, "parallel": 1})
    root = tmp_path / "results" / "ex"
    assert sweep("run", str(spec), cwd=tmp_path).returncode == 0
    unreadable = root / "trials" / "trial-00001.parquet"
    unreadable.write_bytes(unreadable.read_bytes()[:100])
    spec = replay_spec(tmp_path, search={"max_trials": 4, "parallel": 1})
    r = sweep("run", str(spec), "--rebuild-study", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "trial-00001.parquet" in " ".join(r.stderr.split())
    unreadable.unlink()  # read what is left, as pandas would
    df = pd.read_parquet(root / "trials").sort_values("trial_number")
    assert df.trial_number.tolist() == [0, 2, 3, 4], df.trial_number.tolist()
    assert df.optuna_trial.tolist() == df.trial_number.tolist(), df[["trial_number", "optuna_trial"]]
    trials = study_of(root)
    assert [t.user_attrs.get("trial_number") for t in trials] == [0, 1, 2, 3, 4]
    assert trials[1].state.name == "FAIL" and "no readable row" in trials[1].user_attrs["error"]
    assert [t.state.name for t in trials[2:]] == ["COMPLETE"] * 3


# ---- 8: a study that is not this sweep's --------------------------------------------------
def other_run(tmp_path: Path, name: str, **extra) -> Path:
    """The study of a sweep run in another folder (`name`, with `extra` settings)."""
    other = tmp_path / "elsewhere"
    other.mkdir(exist_ok=True)
    spec = replay_spec(other, name, results_dir=str(other / "results"), **extra)
    assert sweep("run", str(spec), cwd=other).returncode == 0
    return other / "results" / name / "optuna.db"


@pytest.mark.parametrize(
    "name, extra, words",
    [
        ("other", {}, "holds the study 'other' of another sweep, not 'ex'"),
        ("ex", {"search": {"max_trials": 4, "parallel": 1}}, "which this sweep never ran"),
        (
            "ex",
            {"search": {"max_trials": 2, "parallel": 1, "sampler": "random", "seed": 3}},
            "has no trial of the layout",
        ),
        ("ex", {"seq_len": 2048, "search": {"max_trials": 2, "parallel": 1}}, "is of the sweep"),
    ],
    ids=["another-sweeps-study", "longer-history", "other-layouts", "another-experiment"],
)
def test_a_study_copied_in_from_elsewhere_is_refused_with_nothing_written(
    tmp_path: Path, name: str, extra: dict, words: str
):
    spec = replay_spec(tmp_path, search={"max_trials": 2, "parallel": 1})
    root = tmp_path / "results" / "ex"
    assert sweep("run", str(spec), cwd=tmp_path).returncode == 0
    db = root / "optuna.db"
    db.write_bytes(other_run(tmp_path, name, **extra).read_bytes())
    before = db.read_bytes()
    more = replay_spec(tmp_path, search={"max_trials": 4, "parallel": 1})
    msg = one_line_error(sweep("run", str(more), cwd=tmp_path))
    assert words in msg and str(db) in msg and "--rebuild-study" in msg, msg
    assert db.read_bytes() == before and len(list((root / "trials").glob("*.parquet"))) == 2
    r = sweep("run", str(more), "--rebuild-study", cwd=tmp_path)  # the way out it names
    assert r.returncode == 0, r.stderr
    assert optuna.get_all_study_names(f"sqlite:///{db}") == ["ex"]
    assert_numbered_alike(root, rows=4)
