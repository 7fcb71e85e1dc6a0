"""Issue 21, the faults that still got through: the trust check before --fresh and --rebuild-study,
no adoption of a folder sweep did not make, no writes through links in the results folder, a
damaged study that names its repair, a full disk that loses no layout, messages never cut inside
a path; and what a new user stumbled on (YAML errors, NaN, CPU memory, the README's warning).

Most run the real CLI on a replay sweep (no processes); the full-disk tests run one or two real
local trials on a real small tmpfs (root only)."""

from __future__ import annotations

import io
import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from rich.console import Console

from sweeper.errors import SpecError
from sweeper.plan.plan import make_plan
from sweeper.results.rows import ResultsStore
from sweeper.spec.loader import load_sweep, parse_sweep
from tests.conftest import ROOT
from tests.faults.helpers import env_with, spec_file, sweep
from tests.faults.test_hardening import one_line_error, replay_spec

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another user needs root")


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ---- 1: --fresh and --rebuild-study only after the trust check ----------------------------
@ROOT_ONLY
def test_fresh_and_rebuild_study_on_another_users_folder_change_nothing(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    root = tmp_path / "results" / "ex"
    before = files_under(root)
    subprocess.run(["chown", "-R", "4242:4242", str(root)], check=True)
    msg = one_line_error(sweep("run", str(spec), "--fresh", "--yes", cwd=tmp_path))
    assert "owned by user 4242, not you" in msg, msg
    assert files_under(root) == before  # nothing deleted before the refusal
    msg = one_line_error(sweep("run", str(spec), "--rebuild-study", cwd=tmp_path))
    assert "owned by user 4242, not you" in msg, msg
    assert files_under(root) == before and not list(root.glob("optuna.db.corrupt-*"))
    assert {p.stat().st_uid for p in root.rglob("*")} == {4242}


def test_fresh_on_a_folder_writable_by_others_is_refused_not_chmodded(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    root = tmp_path / "results" / "ex"
    before = files_under(root)
    os.chmod(root, 0o777)
    msg = one_line_error(sweep("run", str(spec), "--fresh", "--yes", cwd=tmp_path))
    assert "writable by others" in msg, msg
    assert files_under(root) == before and oct(root.stat().st_mode & 0o777) == oct(0o777)
    msg = one_line_error(sweep("run", str(spec), "--rebuild-study", cwd=tmp_path))
    assert "writable by others" in msg and not list(root.glob("optuna.db.corrupt-*")), msg


# ---- 4: results_dir onto an existing folder sweep did not make ----------------------------
def test_an_existing_folder_that_sweep_did_not_make_is_refused_and_left_as_it_was(tmp_path: Path):
    proj = tmp_path / "code" / "ex"
    proj.mkdir(parents=True)
    (proj / "main.py").write_text("print(1)\n")
    os.chmod(proj, 0o755)
    spec = replay_spec(tmp_path, results_dir=str(tmp_path / "code"))
    for flags in ((), ("--fresh", "--yes")):
        msg = one_line_error(sweep("run", str(spec), *flags, cwd=tmp_path))
        assert "was not made by sweep" in msg and "main.py" in msg, msg
        assert files_under(proj) == ["main.py"] and proj.stat().st_mode & 0o777 == 0o755
    (proj / "main.py").unlink()  # an empty folder has nothing to take over: it is used
    assert sweep("run", str(spec), cwd=tmp_path).returncode == 0


# ---- 3: nothing under the results folder is followed through a link ------------------------
def test_links_in_jobs_inflight_and_beside_the_study_are_refused_or_skipped(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    root = tmp_path / "results" / "ex"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "result.json").write_text("keep")
    more = replay_spec(tmp_path, search={"max_trials": 4, "parallel": 1})
    (root / "jobs" / "trial-00004-a1").symlink_to(victim)  # where the next trial would write
    msg = one_line_error(sweep("run", str(more), cwd=tmp_path))
    assert "trial-00004-a1 is a symbolic link" in msg and str(victim) in msg, msg
    (root / "jobs" / "trial-00004-a1").unlink()
    (root / "optuna.db-journal").symlink_to(victim / "result.json")  # SQLite would write through it
    msg = one_line_error(sweep("run", str(more), cwd=tmp_path))
    assert "optuna.db-journal is a symbolic link" in msg, msg
    (root / "optuna.db-journal").unlink()
    record = {
        "trial_number": 9,
        "optuna_trial": 9,
        "row": 0,
        "attempt": 1,
        "job_id": None,
        "layout": {"tp": 1, "pp": 1, "micro_batch_size": 1},
        "submitted_at": "2026-01-01T00:00:00+00:00",
        "started_at": "2026-01-01T00:00:00+00:00",
    }
    (victim / "rec.json").write_text(json.dumps(record))
    (root / "inflight" / "trial-00009.json").symlink_to(victim / "rec.json")
    status = sweep("status", str(spec), cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "trial-00009.json: a symbolic link, not followed" in status.stderr
    assert "4 finished, 0 running" in status.stdout, status.stdout  # the linked record was not read
    assert (victim / "result.json").read_text() == "keep" and sorted(os.listdir(victim)) == ["rec.json", "result.json"]


# ---- 5: a damaged study names --rebuild-study, which repairs it -------------------------
@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_damaged_study_names_rebuild_study_which_repairs_it(ran_ex: Path, tmp_path: Path, damage: str):
    spec = ran_ex
    root = tmp_path / "results" / "ex"
    db = root / "optuna.db"
    if damage == "truncated":
        os.truncate(db, 4096)
    else:  # the header intact, pages in the middle overwritten
        with open(db, "r+b") as f:
            f.seek(2 * 4096)
            f.write(os.urandom(3 * 4096))
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "--rebuild-study" in msg and "intact" in msg, msg
    r = sweep("run", str(spec), "--rebuild-study", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    study = optuna.load_study(study_name="ex", storage=f"sqlite:///{db}")
    assert sum(t.user_attrs.get("kind") == "rebuilt" for t in study.trials) == 4
    assert len(list((root / "trials").glob("*.parquet"))) == 4 and list(root.glob("optuna.db.corrupt-*"))
    with sqlite3.connect(db) as con:
        assert con.execute("PRAGMA quick_check").fetchone()[0] == "ok"


# ---- 6: a message never cuts a path or a name, whatever the width -----------------------
@pytest.mark.parametrize("columns", ["40", "80"])
def test_warnings_keep_paths_whole_whatever_columns_says(ran_ex: Path, tmp_path: Path, columns: str):
    spec = ran_ex
    trials = tmp_path / "results" / "ex" / "trials"
    stray = trials / "a-stray-copy-with-a-rather-long-name-indeed.parquet"
    shutil.copy(sorted(trials.glob("trial-*.parquet"))[0], stray)
    env = env_with(COLUMNS=columns)
    for cmd in ("status", "best", "run"):
        r = sweep(cmd, str(spec), cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        line = next(ln for ln in r.stderr.splitlines() if "warning:" in ln)
        assert f"{stray}: not a result file of the sweep" in line, (cmd, r.stderr)


def test_on_a_terminal_messages_wrap_between_words_only():
    from sweeper.cli.render import say

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=40, color_system=None)
    path = "/tmp/results/a-sweep-with-a-long-name/trials/trial-00042.parquet"
    say(console, "warning", f"skipped {path}: a row of another sweep [sweep_id 1a2b]")
    lines = out.getvalue().splitlines()
    assert len(lines) > 1 and any(path in ln for ln in lines), lines  # wrapped, the path whole on its line
    assert all(len(ln) <= 40 for ln in lines if path not in ln), lines
    assert "[sweep_id 1a2b]" in out.getvalue()  # plain text, not markup


# ---- 2: a full disk loses no layout ------------------------------------------------------
@pytest.fixture
def full_jobs_disk(tmp_path: Path):
    """A sweep's results folder whose jobs/ is a real 1 MiB tmpfs filled to the last byte (root only):
    the trials cannot write their result, the sweep's own files (rows, study) can."""
    spec = spec_file(
        tmp_path,
        "df",
        search={"max_trials": 1},
        space={"tp": [1], "pp": [2], "micro_batch_size": [1], "attention": ["flash2"]},
    )
    store = ResultsStore(tmp_path / "results" / "df")
    store.ensure()
    if (
        os.geteuid() != 0
        or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=700", "tmpfs", str(store.jobs_dir)]).returncode
    ):
        pytest.skip("mounting a small tmpfs needs root")
    filler = tmp_path / "results" / "df" / "jobs" / "filler"
    try:
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
        try:
            for size in (65536, 4096, 1):
                try:
                    while os.write(fd, b"\0" * size):
                        pass
                except OSError:
                    pass
        finally:
            os.close(fd)
        yield spec, store, filler
    finally:
        subprocess.run(["umount", "-l", str(store.jobs_dir)], check=False)


@pytest.mark.slow
def test_a_trial_the_full_disk_kept_from_writing_is_a_row_that_says_why_and_runs_again(full_jobs_disk):
    spec, store, filler = full_jobs_disk
    cwd = spec.parent
    msg = one_line_error(sweep("run", str(spec), cwd=cwd))
    path = store.jobs_dir / "trial-00000-a1" / "result.json"
    assert "No space left on device" in msg and str(path) in msg and "runs it again" in msg, msg
    df = pd.read_parquet(store.trials_dir)
    assert df.trial_number.tolist() == [0] and df.status.tolist() == ["failed"]
    assert df.error[0].startswith("result not written: No space left on device") and str(path) in df.error[0]
    assert df.attempt.tolist() == [1]  # not retried on the full disk, not counted as a crash
    filler.unlink()  # space again: the same layout runs, the budget of 1 not spent by the lost one
    r = sweep("run", str(spec), cwd=cwd)
    assert r.returncode == 0, r.stderr
    df = pd.read_parquet(store.trials_dir).sort_values("trial_number")
    assert df.status.tolist() == ["failed", "ok"] and df.pp.tolist() == [2, 2]
    study = optuna.load_study(study_name="df", storage=f"sqlite:///{store.root / 'optuna.db'}")
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]


@pytest.mark.slow
def test_a_second_attempt_that_the_full_disk_ended_runs_again_not_vanished_twice(full_jobs_disk):
    """The state the issue's run left: attempt 2 in flight, its process gone on a full disk, the
    sweep stopped (the row could not be written either). After space returns it runs again."""
    spec, store, filler = full_jobs_disk
    filler.unlink()
    plan = make_plan(load_sweep(spec))
    row = int(np.flatnonzero(plan.candidate_mask)[0])
    study = optuna.create_study(study_name="df", storage=f"sqlite:///{store.root / 'optuna.db'}", direction="maximize")
    trial = study.ask()
    a2 = store.jobs_dir / "trial-00000-a2"
    a2.mkdir()
    (a2 / "log.txt").write_text("Traceback ...\nOSError: [Errno 28] No space left on device\n")
    (a2 / "result.json").write_text("")
    stamp = "2026-01-01T00:00:00+00:00"
    store.record_inflight(
        0,
        {
            "trial_number": 0,
            "optuna_trial": trial.number,
            "row": row,
            "attempt": 2,
            "job_id": "local-999999999",
            "layout": plan.layout(row).as_dict(),
            "submitted_at": stamp,
            "started_at": stamp,
            "previous_error": "the trial process ended without a result",
        },
    )
    shutil.copy(spec, store.root / "sweep.yaml")
    r = sweep("run", str(spec), cwd=spec.parent)
    assert r.returncode == 0, r.stderr
    df = pd.read_parquet(store.trials_dir)
    assert df.status.tolist() == ["ok"] and "vanished twice" not in str(df.error.tolist())


# ---- stumbles ------------------------------------------------------------------------------
def test_a_yaml_syntax_error_names_the_file_and_line_on_one_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: y\nspace: {tp: [1, 2\n")
    msg = one_line_error(sweep("run", str(bad), "--dry-run", cwd=tmp_path))
    assert f"{bad}: invalid YAML at line 3" in msg and "<unicode string>" not in msg, msg


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_number_fields_refuse_nan_and_inf_as_such(tmp_path: Path, value: str):
    spec = yaml.safe_load(replay_spec(tmp_path).read_text())
    text = yaml.safe_dump(spec | {"trial": {"timeout_min": 5}}).replace("timeout_min: 5", f"timeout_min: {value}")
    with pytest.raises(SpecError, match=r"trial.timeout_min: Input should be a finite number") as e:
        parse_sweep(text)
    assert "10000" not in str(e.value)


def test_the_terminal_table_says_cpu_memory_is_rss_growth(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    store = ResultsStore(tmp_path / "cpu")
    store.ensure()
    store.write_row(
        {
            "trial_number": 0,
            "status": "ok",
            "tp": 1,
            "pp": 1,
            "micro_batch_size": 1,
            "mfu": 0.01,
            "device": "cpu",
            "peak_mem_gib": 0.0254,
            "pred_mem_gib": 0.306,
        }
    )
    r = sweep("best", str(spec), "--results", str(store.root), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "peak GiB on CPU: RSS growth" in r.stdout, r.stdout
    r = sweep("best", str(spec), cwd=tmp_path)  # GPU rows: no such line
    assert r.returncode == 0 and "RSS growth" not in r.stdout, r.stdout


def test_the_readme_says_a_sweep_file_is_code_beside_the_results_folder():
    readme = (ROOT / "README.md").read_text()
    para = next(p for p in readme.split("\n\n") if "trusted like code" in p)
    flat = " ".join(para.split())
    assert "workload.command" in flat and "a sweep file is code" in flat.lower(), flat
