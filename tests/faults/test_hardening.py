"""Issue 12: stray and foreign files, --fresh, storage and folder errors, hostile sweep files,
launcher injection and results-folder permissions, all through the real CLI on real files.
Trials are answered by the replay launcher (a real launcher, no processes), so each run is quick."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml

from sweeper.errors import SpecError, SweepError
from sweeper.launchers.profiles import resolve_profile
from sweeper.results.folder import check_trusted_file
from sweeper.results.rows import ResultsStore
from sweeper.spec.loader import parse_sweep
from tests.faults.helpers import env_with, sweep

ROWS = [
    {"tp": tp, "pp": pp, "micro_batch_size": 1, "status": "ok", "mfu": 0.1 * (tp + 2 * pp)}
    for tp in (1, 2)
    for pp in (1, 2)
]


def replay_spec(tmp_path: Path, name: str = "ex", **extra) -> Path:
    """A 4-layout sweep answered from a CSV table (as /work/shared/checks/_replay_results.py makes)."""
    table = tmp_path / f"{name}.csv"
    pd.DataFrame(ROWS).to_csv(table, index=False)
    spec = {
        "name": name,
        "model": {"layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn": 5632, "vocab": 32000},
        "seq_len": 4096,
        "global_batch_size": 512,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": {"tp": [1, 2], "pp": [1, 2], "micro_batch_size": [1]},
        "search": {"max_trials": 4, "parallel": 1},
        "launcher": {"kind": "replay", "table": str(table)},
        "results_dir": str(tmp_path / "results"),
    } | extra
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def one_line_error(r: subprocess.CompletedProcess) -> str:
    """A user error: exit 2, no traceback, one `error:` line."""
    assert r.returncode == 2, (r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    # one error line, the last (a live display may have been drawn before it)
    assert lines and "error:" in lines[-1] and r.stderr.count("error:") == 1, r.stderr
    return " ".join(r.stderr.split())


def ran(tmp_path: Path, name: str = "ex") -> Path:
    spec = replay_spec(tmp_path, name)
    r = sweep("run", str(spec), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return spec


# ---- 3: stray files ------------------------------------------------------------------
def test_stray_copies_and_bad_inflight_records_are_named_and_skipped(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    root = tmp_path / "results" / "ex"
    first = sorted((root / "trials").glob("trial-*.parquet"))[0]
    shutil.copy(first, root / "trials" / "trial-00001 (copy).parquet")
    (root / "inflight" / "trial-00007.json").write_text("{}")
    (root / "inflight" / "trial-00008.json").write_text("[]")
    for cmd in (("status", str(spec)), ("run", str(spec)), ("best", str(spec))):
        r = sweep(*cmd, cwd=tmp_path)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (cmd, r.stderr)
        flat = " ".join(r.stderr.split())
        assert "trial-00001 (copy).parquet" in flat and (cmd[0] == "best" or "trial-00007.json" in flat), (cmd, flat)
    assert len(list((root / "trials").glob("trial-?????.parquet"))) == 4  # nothing rerun, nothing mixed in


def test_a_row_of_another_sweep_is_refused_by_run_and_skipped_by_best(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    other = tmp_path / "other"
    other.mkdir()
    replay_spec(other, "ex", seq_len=2048, results_dir=str(other / "results"))  # same name, another experiment
    r = sweep("run", str(other / "ex.yaml"), cwd=other)
    assert r.returncode == 0, r.stderr
    planted = tmp_path / "results" / "ex" / "trials" / "trial-00042.parquet"
    shutil.copy(sorted((other / "results" / "ex" / "trials").glob("*.parquet"))[0], planted)
    best = sweep("best", str(spec), "--format", "json", cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    assert json.loads(best.stdout)["best"]["trial_number"] != 42 and "trial-00042" in best.stderr
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "another sweep" in msg and "trial-00042" in msg, msg


# ---- 4: no identity to compare ----------------------------------------------------------
@pytest.mark.usefixtures("ran_ex")
def test_a_changed_sweep_is_refused_even_without_the_recorded_sweep_file(tmp_path: Path):
    root = tmp_path / "results" / "ex"
    (root / "sweep.yaml").unlink()
    changed = replay_spec(tmp_path, "ex", seq_len=8192)
    msg = one_line_error(sweep("run", str(changed), cwd=tmp_path))
    assert "another sweep" in msg, msg
    assert len(list((root / "trials").glob("*.parquet"))) == 4


def test_rows_without_identity_and_without_sweep_file_are_refused(tmp_path: Path):
    spec = replay_spec(tmp_path)
    store = ResultsStore(tmp_path / "results" / "ex")
    store.ensure()
    store.write_row({"trial_number": 0, "status": "ok", "tp": 1, "pp": 1, "micro_batch_size": 1, "mfu": 0.3})
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "no sweep identity" in msg and "sweep.yaml is gone" in msg, msg


# ---- 5: --fresh deletes only the tool's files -------------------------------------------
def test_fresh_refuses_and_deletes_nothing_when_foreign_files_are_there(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    root = tmp_path / "results" / "ex"
    (root / "notes.txt").write_text("keep")
    (root / "trials" / "analysis.csv").write_text("keep")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    msg = one_line_error(sweep("run", str(spec), "--fresh", "--yes", cwd=tmp_path))
    assert "notes.txt" in msg and "nothing deleted" in msg, msg
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before
    (root / "notes.txt").unlink()
    (root / "trials" / "analysis.csv").unlink()
    r = sweep("run", str(spec), "--fresh", "--yes", cwd=tmp_path)  # only the tool's files: a fresh start
    assert r.returncode == 0, r.stderr
    assert len(list((root / "trials").glob("*.parquet"))) == 4


# ---- 6 and 7: the study ---------------------------------------------------------------
def test_corrupt_study_is_one_line_then_rebuilt_from_rows(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    root = tmp_path / "results" / "ex"
    (root / "optuna.db").write_bytes(b"garbage")
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "--rebuild-study" in msg and "intact" in msg, msg
    r = sweep("run", str(spec), "--rebuild-study", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rebuilt" in " ".join(r.stderr.split())
    assert list(root.glob("optuna.db.corrupt-*"))  # set aside, not deleted
    study = optuna.load_study(study_name="ex", storage=f"sqlite:///{root / 'optuna.db'}")
    assert sum(t.user_attrs.get("kind") == "rebuilt" for t in study.trials) == 4
    assert len(list((root / "trials").glob("*.parquet"))) == 4  # nothing rerun


def test_deleted_study_is_rebuilt_and_said_so(tmp_path: Path):
    spec = replay_spec(tmp_path, search={"max_trials": 2, "parallel": 1, "sampler": "grid"})
    assert sweep("run", str(spec), cwd=tmp_path).returncode == 0
    root = tmp_path / "results" / "ex"
    (root / "optuna.db").unlink()
    spec = replay_spec(tmp_path, search={"max_trials": 4, "parallel": 1, "sampler": "grid"})
    r = sweep("run", str(spec), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "rebuilt it from them" in " ".join(r.stderr.split()), r.stderr
    df = pd.read_parquet(root / "trials")
    assert len(df) == 4 and not df[["tp", "pp"]].duplicated().any()  # the 2 old layouts were not rerun
    study = optuna.load_study(study_name="ex", storage=f"sqlite:///{root / 'optuna.db'}")
    new = df[df.trial_number >= 2].optuna_trial.tolist()
    assert all(n >= 2 for n in new), new  # new Optuna numbers come after the rebuilt ones
    assert [t.user_attrs.get("kind") for t in study.trials[:2]] == ["rebuilt", "rebuilt"]


@pytest.mark.parametrize(
    "storage, words",
    [
        ("not a url", "is not an Optuna storage URL"),
        ("sqlite:////nonexistent/folder/optuna.db", "does not exist"),
        ("/nonexistent/folder/study.journal", "does not exist"),
    ],
)
def test_bad_storage_is_one_line_and_creates_nothing(tmp_path: Path, storage: str, words: str):
    spec = replay_spec(tmp_path, search={"max_trials": 4, "parallel": 1, "storage": storage})
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert words in msg, msg
    assert not (tmp_path / "results").exists()


def test_results_dir_that_cannot_be_made_is_one_line_and_creates_nothing(tmp_path: Path):
    (tmp_path / "afile").write_text("x")
    spec = replay_spec(tmp_path, results_dir=str(tmp_path / "afile" / "results"))
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "is not a folder" in msg, msg


@pytest.fixture
def mount_tmpfs(tmp_path: Path):
    """Mount a real tmpfs with the given options (root only)."""
    mounted = []

    def mount(name: str, options: str) -> Path:
        mnt = tmp_path / name
        mnt.mkdir()
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)]).returncode:
            pytest.skip("mounting a tmpfs needs root")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_read_only_results_dir_is_one_line(tmp_path: Path, mount_tmpfs):
    mnt = mount_tmpfs("ro", "size=1m,ro")
    spec = replay_spec(tmp_path, results_dir=str(mnt / "results"))
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "not writable" in msg, msg


def test_full_disk_under_the_sqlite_study_is_one_line(tmp_path: Path, mount_tmpfs):
    disk = mount_tmpfs("disk", "size=256k")
    storage = f"sqlite:///{disk / 'optuna.db'}"
    spec = replay_spec(tmp_path, search={"max_trials": 1, "parallel": 1, "storage": storage})
    assert sweep("run", str(spec), cwd=tmp_path).returncode == 0
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        for size in (65536, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    spec = replay_spec(tmp_path, search={"max_trials": 4, "parallel": 1, "storage": storage})
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "full" in msg and "intact" in msg, msg
    assert len(list((tmp_path / "results" / "ex" / "trials").glob("*.parquet"))) >= 1


# ---- 8: sweep files ---------------------------------------------------------------------
def test_duplicate_keys_are_refused_with_key_and_line(tmp_path: Path):
    text = replay_spec(tmp_path).read_text() + "seq_len: 8192\n"
    with pytest.raises(SpecError, match=r"duplicate key 'seq_len' \(line \d+; first on line 9\)"):
        parse_sweep(text)


@pytest.mark.parametrize("value", ["'64'", "64.0", "true"])
def test_integers_are_strict(tmp_path: Path, value: str):
    text = replay_spec(tmp_path).read_text().replace("seq_len: 4096", f"seq_len: {value}")
    with pytest.raises(SpecError, match="seq_len"):
        parse_sweep(text)
    text = replay_spec(tmp_path).read_text().replace("- 1\n  - 2\n  pp", f"- 1\n  - {value}\n  pp")
    with pytest.raises(SpecError, match="space.tp"):
        parse_sweep(text)


def test_huge_space_is_refused_before_allocating(tmp_path: Path):
    spec = yaml.safe_load(replay_spec(tmp_path).read_text())
    spec["space"] = {
        "tp": [1, 2, 4, 8],
        "pp": [1, 2, 4, 8],
        "micro_batch_size": list(range(1, 257)),
        "virtual_stages": list(range(1, 257)),
        "activation_checkpointing": ["none", "full"],
        "attention": ["eager", "flash2"],
    }  # 4*4*256*256*2*2 = 4,194,304 layouts
    t0 = time.perf_counter()
    with pytest.raises(SpecError) as e:
        parse_sweep(yaml.safe_dump(spec))
    assert time.perf_counter() - t0 < 2
    msg = str(e.value)
    assert "4,194,304 layouts" in msg and "micro_batch_size (256 values)" in msg and "virtual_stages" in msg, msg


@pytest.mark.parametrize(
    "workload, words",
    [
        (
            {"kind": "command", "command": "python train.py --tp {tp} --oops {nonsense}"},
            "unknown placeholder {nonsense}",
        ),
        ({"kind": "command", "command": "python train.py {tp", "env": {}}, "bad braces"),
        ({"kind": "command", "command": "python train.py", "env": {"A-B": "1"}}, "not an environment variable name"),
        ({"kind": "command", "command": "python train.py", "cwd": "/nonexistent/folder"}, "not an existing folder"),
    ],
)
def test_workload_is_checked_at_load(tmp_path: Path, workload: dict, words: str):
    spec = replay_spec(tmp_path, workload=workload)
    msg = one_line_error(sweep("run", str(spec), "--dry-run", cwd=tmp_path))
    assert words in msg and "workload" in msg, msg


def test_local_launcher_without_the_processes_a_layout_needs_is_refused_before_it_runs(tmp_path: Path):
    # a dry run plans any cluster; running 16 x 8 = 128 local processes is refused before anything is created
    spec = replay_spec(tmp_path, launcher="local", cluster={"nodes": 16, "gpus_per_node": 8, "gpu": "h100-sxm"})
    assert sweep("run", str(spec), "--dry-run", cwd=tmp_path).returncode == 0
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "local launcher" in msg and "128" in msg, msg
    assert not (tmp_path / "results").exists()


# ---- 9: launcher injection ----------------------------------------------------------------
@pytest.mark.parametrize(
    "inline",
    [
        {"kind": "slurm", "setup": ["echo $(touch /tmp/pwned)"]},
        {"kind": "slurm", "sbatch_extra": {"output": "/root/.bashrc", "open-mode": "append"}},
        {"kind": "slurm", "srun_args": ["--export=ALL,LD_PRELOAD=/tmp/x.so"]},
    ],
)
def test_inline_launcher_may_not_carry_job_script_lines(tmp_path: Path, inline: dict):
    spec = replay_spec(tmp_path, launcher=inline)
    msg = one_line_error(sweep("run", str(spec), "--dry-run", cwd=tmp_path))
    assert "not allowed in a sweep file's inline launcher" in msg, msg


def _profile_sweep(tmp_path: Path, profile: dict):
    (tmp_path / "launchers").mkdir(exist_ok=True)
    (tmp_path / "launchers" / "site.yaml").write_text(yaml.safe_dump(profile))
    return parse_sweep(replay_spec(tmp_path, launcher="site").read_text())


@pytest.mark.parametrize(
    "extra, denied",
    [
        ({"sbatch_extra": {"output": "/root/.bashrc"}}, "output"),
        ({"sbatch_extra": {"error": "/tmp/e"}}, "error"),
        ({"sbatch_extra": {"export": "ALL,LD_PRELOAD=/x.so"}}, "export"),
        ({"sbatch_extra": {"chdir": "/tmp"}}, "chdir"),
        ({"sbatch_extra": {"requeue": True}}, "requeue"),
        ({"sbatch_extra": {"wrap": "id"}}, "wrap"),
        ({"srun_args": ["--export=ALL,LD_PRELOAD=/x.so"]}, "export"),
        ({"srun_args": ["-o", "/root/.bashrc"]}, "output"),
    ],
)
def test_profiles_deny_redirecting_directives_unless_allowed(tmp_path: Path, monkeypatch, extra: dict, denied: str):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SpecError, match=f"the '{denied}' option .* is denied"):
        resolve_profile(_profile_sweep(tmp_path, {"kind": "slurm", **extra}))
    allowed = resolve_profile(_profile_sweep(tmp_path, {"kind": "slurm", "allow_directives": [denied], **extra}))
    assert allowed.kind == "slurm"


def test_site_profiles_keep_setup_and_safe_options(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = resolve_profile(
        _profile_sweep(
            tmp_path,
            {
                "kind": "slurm",
                "setup": ["module load cuda"],
                "sbatch_extra": {"gres-flags": "enforce-binding"},
                "srun_args": ["--cpu-bind=cores"],
            },
        )
    )
    assert p.setup == ["module load cuda"] and p.srun_args == ["--cpu-bind=cores"]


# ---- 10: permissions and pickles ---------------------------------------------------------
def test_results_folder_is_private_under_a_permissive_umask(tmp_path: Path):
    spec = replay_spec(tmp_path)
    r = subprocess.run(
        [
            "bash",
            "-c",
            f"umask 000; exec {' '.join(__import__('tests.faults.helpers', fromlist=['cli']).cli('run', str(spec)))}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env_with(),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    root = tmp_path / "results" / "ex"
    modes = {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}
    assert all(m & 0o077 == 0 for m in modes.values()), modes


def test_results_folder_writable_by_others_is_refused(ran_ex: Path, tmp_path: Path):
    spec = ran_ex
    root = tmp_path / "results" / "ex"
    os.chmod(root, 0o777)
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "writable by others" in msg and "trusted like code" in msg, msg
    os.chmod(root, 0o700)
    os.chmod(root / "sweep.yaml", 0o666)
    msg = one_line_error(sweep("run", str(spec), cwd=tmp_path))
    assert "sweep.yaml: writable by others" in msg, msg


def test_planted_pickle_is_refused_unread(tmp_path: Path):
    import pickle

    marker = tmp_path / "pwned"

    class Boom:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    pkl = tmp_path / "123_0_result.pkl"
    pkl.write_bytes(pickle.dumps(Boom()))
    os.chmod(pkl, 0o666)  # planted by someone who could write the folder
    with pytest.raises(SweepError, match="refusing to unpickle"):
        check_trusted_file(pkl)
    os.chmod(pkl, 0o600)
    if os.geteuid() == 0:
        os.chown(pkl, 65534, 65534)  # another user's file
        with pytest.raises(SweepError, match="refusing to unpickle"):
            check_trusted_file(pkl)
        os.chown(pkl, 0, 0)
    link = tmp_path / "124_0_result.pkl"
    link.symlink_to(pkl)
    with pytest.raises(SweepError, match="not a plain file"):
        check_trusted_file(link)
    check_trusted_file(pkl)  # our own private file passes
    assert not marker.exists()
