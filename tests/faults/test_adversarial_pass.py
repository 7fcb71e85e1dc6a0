"""Issue 27, breaks 3 to 7 of the adversarial pass and the read commands' links: nothing written
through a link in a trial's job folder or beside a report, no project folder taken over (the
trust check before any chmod or file), deeply nested YAML and malformed command placeholders as
one line. The real CLI on a replay sweep; the job-folder tests run real local trials."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import pytest
import yaml

from sweeper.launchers.base import TrialJob
from sweeper.launchers.local import LocalLauncher
from sweeper.layouts.layout import Layout
from tests.faults.helpers import results, spec_file, sweep
from tests.faults.test_hardening import one_line_error, replay_spec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def tree(root: Path) -> list[tuple[str, int]]:
    """Every entry under `root` with its mode: what 'nothing changed' compares."""
    return sorted((str(p.relative_to(root)), p.lstat().st_mode) for p in [root, *root.rglob("*")])


def victim(tmp_path: Path) -> Path:
    """A folder outside any results folder, with files a planted link points at (a 0600 one among them)."""
    v = tmp_path / "victim"
    (v / "ranksdir").mkdir(parents=True)
    for name in ("result.json", "log.txt", "task.pkl", "secret"):
        (v / name).write_text(f"keep {name}\n")
    os.chmod(v / "secret", 0o600)
    return v


def untouched(v: Path) -> None:
    assert sorted(p.name for p in v.iterdir()) == ["log.txt", "ranksdir", "result.json", "secret", "task.pkl"]
    assert not list((v / "ranksdir").iterdir()), list((v / "ranksdir").iterdir())
    for name in ("result.json", "log.txt", "task.pkl", "secret"):
        assert (v / name).read_text() == f"keep {name}\n", name
    assert stat.S_IMODE((v / "secret").stat().st_mode) == 0o600


# ---- 3: links inside a trial's job folder ----------------------------------------------------
def plant_job_links(job: Path, v: Path) -> None:
    job.mkdir(parents=True)
    (job / "result.json").symlink_to(v / "result.json")
    (job / "log.txt").symlink_to(v / "log.txt")
    (job / "ranks").symlink_to(v / "ranksdir")


def test_sweep_run_refuses_a_job_folder_holding_links_and_writes_nothing_through_them(tmp_path: Path):
    """The issue's copied results folder: a pre-made job folder of the next trial whose result.json,
    log.txt and ranks are links to files elsewhere. Before: the trial's result, its log and the
    task.pkl the ranks unpickle were written into the links' targets."""
    v = victim(tmp_path)
    spec = spec_file(tmp_path, "tl", search={"max_trials": 1})
    plant_job_links(results(tmp_path, "tl") / "jobs" / "trial-00000-a1", v)
    (results(tmp_path, "tl") / "trials").mkdir()
    before = tree(results(tmp_path, "tl"))
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "trial-00000-a1/log.txt is a symbolic link" in msg and str(v / "log.txt") in msg, msg
    untouched(v)
    assert tree(results(tmp_path, "tl")) == before  # refused before anything was made


def wait_outcome(launcher: LocalLauncher, handle, *, timeout: float = 300):  # noqa: ANN001, ANN201
    deadline = time.time() + timeout
    while (outcome := launcher.poll(handle)) is None:
        assert time.time() < deadline, "the trial did not end"
        time.sleep(0.2)
    return outcome


@pytest.mark.slow
@pytest.mark.parametrize("where", ["job folder", "ranks folder"])
def test_a_launch_replaces_links_in_its_job_folder_and_never_follows_them(tmp_path: Path, where: str):
    """What the run's check does not see (a link made after it, `sweep trial --workdir`): the local
    launcher and the ranks' launch replace a link at each name they write, in the job folder
    (result.json, log.txt, ranks) and in the ranks' folder (task.pkl, logs, out)."""
    v = victim(tmp_path)
    spec = spec_file(tmp_path, "lk")
    job_dir = tmp_path / "jobs" / "trial-00000-a1"
    if where == "job folder":
        plant_job_links(job_dir, v)
    else:
        (job_dir / "ranks").mkdir(parents=True)
        (job_dir / "ranks" / "task.pkl").symlink_to(v / "task.pkl")
        (job_dir / "ranks" / "logs").symlink_to(v / "ranksdir")
        (job_dir / "ranks" / "out").symlink_to(v / "ranksdir")
    launcher = LocalLauncher()
    try:
        outcome = wait_outcome(launcher, launcher.submit(TrialJob(0, Layout(), spec, job_dir, timeout_s=240)))
    finally:
        launcher.close()
    assert outcome.result.status == "ok", outcome.result.error
    untouched(v)
    for p in (job_dir / "result.json", job_dir / "log.txt", job_dir / "ranks" / "task.pkl"):
        assert p.is_file() and not p.is_symlink(), p
    for p in (job_dir / "ranks", job_dir / "ranks" / "logs", job_dir / "ranks" / "out"):
        assert p.is_dir() and not p.is_symlink(), p
    assert '"status": "ok"' in (job_dir / "result.json").read_text()


# ---- 4: sweep report never writes through a link ---------------------------------------------
def test_report_replaces_a_linked_png_and_leaves_its_target_alone(ran_ex: Path, tmp_path: Path):
    """Before: `progress.png` linked to another file turned that file into a PNG (as root, a 0600
    file of another folder was overwritten)."""
    v = victim(tmp_path)
    root = tmp_path / "results" / "ex"
    (root / "progress.png").symlink_to(v / "secret")
    (root / "status.png").symlink_to(v / "result.json")
    r = sweep("report", str(ran_ex), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    untouched(v)
    pngs = r.stdout.split("plots: ", 1)[1].rstrip(")\n").split(", ")
    assert {"progress.png", "status.png"} <= set(pngs), r.stdout
    for name in pngs:
        p = root / name
        assert not p.is_symlink() and p.read_bytes().startswith(PNG_MAGIC), name
    assert not list(root.glob(".*.png.*.tmp"))  # no temp file left


# ---- 5: a folder the tool did not make is not taken over -------------------------------------
def project(tmp_path: Path, *, trials: bool = True, **files: str) -> Path:
    """An existing folder of someone's where the sweep's results folder would be (mode 755), with a
    `trials/` of its own."""
    d = tmp_path / "results" / "ex"
    d.mkdir(parents=True)
    if trials:
        (d / "trials").mkdir()
        (d / "trials" / "run-1.csv").write_text("epoch,loss\n1,0.5\n")
    for name, text in files.items():
        (d / name).write_text(text)
    os.chmod(d, 0o755)
    return d


@pytest.mark.parametrize(
    "files, trials, words",
    [
        ({"main.py": "print(1)\n"}, True, "was not made by sweep (it holds main.py"),
        (
            {"sweep.yaml": "services:\n  web:\n    image: nginx\n"},
            True,
            "sweep.yaml is not a sweep file (it names no sweep)",
        ),
        ({"sweep.yaml": "name: other\nmodel: llama-7b\n"}, True, "the sweep file of 'other', not of the sweep 'ex'"),
        ({"sweep.yaml": "name: ex\n", "main.py": "print(1)\n"}, False, "(it holds sweep.yaml but no trials/)"),
    ],
    ids=["code", "unrelated-yaml", "another-sweep", "own-name-no-layout"],
)
def test_a_project_folder_holding_trials_is_refused_with_nothing_changed(
    tmp_path: Path, files: dict, trials: bool, words: str
):
    """Before: a folder holding a `trials/` of its own was taken (exit 0, chmod 700, the tool's files
    mixed in); one with an unrelated sweep.yaml was refused only after the chmod and run.lock,
    inflight/, jobs/ and trials/ were made. A user's own sweep file in their project folder is no mark either."""
    d = project(tmp_path, trials=trials, **files)
    before = tree(d)
    spec = replay_spec(tmp_path)
    r = sweep("run", str(spec), cwd=tmp_path)
    assert tree(d) == before  # nothing made, no chmod
    msg = one_line_error(r)
    assert words in msg and "nothing was changed" in msg, msg


def test_a_home_like_folder_is_refused_by_fresh_and_rebuild_study_before_any_change(tmp_path: Path):
    """Before: `--fresh --yes` said "nothing deleted" yet chmodded the folder and made run.lock,
    after which `--rebuild-study` took it for a results folder."""
    d = project(tmp_path, **{".bashrc": "alias ll='ls -l'\n", ".profile": "", "notes.txt": "todo\n"})
    before = tree(d)
    spec = replay_spec(tmp_path)
    for flags in (("--fresh", "--yes"), ("--rebuild-study",), ("--fresh", "--yes")):
        r = sweep("run", str(spec), *flags, cwd=tmp_path)
        assert tree(d) == before, flags  # no chmod, no run.lock
        msg = one_line_error(r)
        assert "was not made by sweep (it holds .bashrc, .profile, notes.txt" in msg, (flags, msg)


def test_folders_the_tool_made_are_still_its_own(ran_ex: Path, tmp_path: Path):
    """The marks: this sweep's recorded sweep.yaml beside trials/ (a user's notes beside them are
    fine), or only the tool's own names (a run stopped before it recorded the sweep file)."""
    root = tmp_path / "results" / "ex"
    (root / "notes.txt").write_text("a note of the user's\n")
    more = replay_spec(tmp_path, search={"max_trials": 4, "parallel": 1})
    assert sweep("run", str(more), cwd=tmp_path).returncode == 0
    stopped = tmp_path / "results" / "st"
    for d in ("trials", "inflight", "jobs"):
        (stopped / d).mkdir(parents=True)
    (stopped / "run.lock").write_text("")
    os.chmod(stopped, 0o700)
    r = sweep("run", str(replay_spec(tmp_path, "st")), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (stopped / "sweep.yaml").is_file() and len(list((stopped / "trials").iterdir())) == 4


# ---- 6: deeply nested YAML ---------------------------------------------------------------------
DEEP = "extra: " + "[" * 400 + "]" * 400 + "\n"  # about 1 KB


def test_deeply_nested_yaml_is_one_line_in_the_sweep_file_and_in_a_results_folders_sweep_yaml(
    ran_ex: Path, tmp_path: Path
):
    """Before: exit 1 and a RecursionError traceback thousands of lines long."""
    deep = tmp_path / "deep.yaml"
    deep.write_text(ran_ex.read_text() + DEEP)
    msg = one_line_error(sweep("run", str(deep), "--dry-run", cwd=tmp_path))
    assert f"{deep}: invalid YAML at line" in msg and "nested more than 32 levels deep" in msg, msg
    root = tmp_path / "results" / "ex"
    recorded = root / "sweep.yaml"
    recorded.write_text(recorded.read_text() + DEEP)
    for args in (("best", str(ran_ex), "--results", str(root)), ("report", str(ran_ex)), ("run", str(ran_ex))):
        msg = one_line_error(sweep(*args, cwd=tmp_path))
        assert f"{recorded}" in msg and "nested more than 32 levels deep" in msg, (args, msg)


# ---- 7: malformed placeholders in workload.command ------------------------------------------
@pytest.mark.parametrize(
    "command, shown",
    [
        ("echo {nproc.foo}", "{nproc.foo}"),
        ("echo --tp={tp[5]}", "{tp[5]}"),
        ("echo {nproc!r:>99999999999}", "{nproc!r:>99999999999}"),
        ("echo {world:>9}", "{world:>9}"),
    ],
)
def test_a_placeholder_that_is_not_a_plain_name_is_refused_when_the_file_is_loaded(
    tmp_path: Path, command: str, shown: str
):
    """Before: the dry run passed, then every trial failed with a traceback (a MemoryError for the
    huge width)."""
    spec = yaml.safe_load(replay_spec(tmp_path).read_text())
    path = tmp_path / "ph.yaml"
    path.write_text(yaml.safe_dump(spec | {"workload": {"kind": "command", "command": command}}))
    msg = one_line_error(sweep("run", str(path), "--dry-run", cwd=tmp_path))
    assert f"workload.command: placeholder {shown} in " in msg and "must be a plain {" in msg, msg
    assert "allowed: activation_checkpointing," in msg and " nproc," in msg and " world" in msg, msg


# ---- the read commands refuse the links `sweep run` refuses ------------------------------------
@pytest.mark.parametrize("linked", ["the results folder", "trials", "sweep.yaml"])
def test_best_status_and_report_refuse_a_linked_results_folder_like_run(ran_ex: Path, tmp_path: Path, linked: str):
    """Before: `best`, `status` and `report` read through the link without a word while `run` refused."""
    root = tmp_path / "results" / "ex"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = root if linked == "the results folder" else root / linked
    shutil.move(path, elsewhere / path.name)
    path.symlink_to(elsewhere / path.name)
    for args in (("run", str(ran_ex)), ("best", str(ran_ex)), ("status", str(ran_ex)), ("report", str(ran_ex))):
        msg = one_line_error(sweep(*args, cwd=tmp_path))
        assert f"{path} is a symbolic link (to {elsewhere / path.name})" in msg, (args, msg)
    assert not list(elsewhere.rglob("*.png"))  # no report written through it
