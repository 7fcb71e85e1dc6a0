"""`sweep run` end to end on the local launcher: real trials on CPU, resume, lock, best, status."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import SPACES, start_cli, sweep_cli

pytestmark = pytest.mark.slow


def tiny_spec(tmp_path: Path, name: str = "tiny", **search) -> Path:
    spec = yaml.safe_load((SPACES / "tiny_cpu.yaml").read_text())
    spec["name"] = name
    spec["results_dir"] = str(tmp_path / "results")
    spec["trial"].update(steps=4, warmup_steps=1)
    spec["search"] = {"max_trials": 3, "parallel": 1, "seed": 0} | search
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def frame(tmp_path: Path, name: str = "tiny") -> pd.DataFrame:
    return pd.read_parquet(tmp_path / "results" / name / "trials")


def wait_for_rows(tmp_path: Path, n: int, name: str = "tiny", timeout: float = 300) -> None:
    trials = tmp_path / "results" / name / "trials"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if trials.is_dir() and len(list(trials.glob("*.parquet"))) >= n:
            return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {n} rows after {timeout} s")


def test_sweep_runs_trials_and_best_reads_them(tiny_cpu_sweep, tmp_path):
    spec, r = tiny_cpu_sweep.spec, tiny_cpu_sweep.run  # 4 trials, run once for this test and report/test_page
    assert r.returncode == 0, r.stderr[-3000:]
    df = pd.read_parquet(tiny_cpu_sweep.results / "trials")
    assert sorted(df.trial_number) == [0, 1, 2, 3]
    assert (df.status == "ok").all(), df[["status", "error"]]
    assert df.step_times_s.map(len).eq(4).all()
    assert ((df.mfu > 0) & (df.mfu < 1)).all()
    assert df.job_id.str.startswith("local-").all() and df.pred_mem_gib.gt(0).all()
    assert df.drop_duplicates(["tp", "pp", "micro_batch_size", "activation_checkpointing"]).shape[0] == 4
    assert "best layouts" in r.stdout
    # each trial's ranks were forked from the zygote the run kept warm (launchers/forking.py), none from its own
    logs = [p.read_text() for p in (tiny_cpu_sweep.results / "jobs").glob("trial-*/log.txt")]
    assert len(logs) == 4 and not [log for log in logs if "warm zygote did not take" in log], logs
    best = sweep_cli("best", str(spec), "--format", "json", "--top", "2", cwd=tmp_path)
    doc = json.loads(best.stdout)
    rows = doc["top"]
    assert doc["trials"] == 4 and doc["statuses"] == {"ok": 4} and doc["best"] == rows[0]
    assert len(rows) == 2 and rows[0]["mfu"] == df.mfu.max() and rows[0]["mfu"] >= rows[1]["mfu"]
    status = sweep_cli("status", str(spec), "--json", cwd=tmp_path)
    assert [json.loads(line)["status"] for line in status.stdout.splitlines()] == ["ok"] * 4
    # a second run with the budget spent does nothing new
    again = sweep_cli("run", str(spec), cwd=tmp_path)
    assert again.returncode == 0 and len(pd.read_parquet(tiny_cpu_sweep.results / "trials")) == 4
    # best from a copied results folder alone
    copy = tmp_path / "elsewhere"
    subprocess.run(["cp", "-r", str(tiny_cpu_sweep.results), str(copy)], check=True)
    alone = sweep_cli("best", "anything", "--results", str(copy), "--format", "json", cwd=tmp_path)
    assert json.loads(alone.stdout)["best"]["trial_number"] == rows[0]["trial_number"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_sweep_resumes_without_rerunning(tmp_path, sig):
    spec = tiny_spec(tmp_path, max_trials=3)  # one done, one in flight when stopped, one never started
    proc = start_cli("run", str(spec), cwd=tmp_path)
    wait_for_rows(tmp_path, 1)
    time.sleep(1.0)  # the next trial is in flight
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=120)
    # Ctrl-C: the trials that ran are shown, and the exit status says the sweep did not finish
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGKILL), out[-2000:]
    r = sweep_cli("run", str(spec), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    df = frame(tmp_path)
    assert sorted(df.trial_number) == [0, 1, 2]
    assert (df.status == "ok").all(), df[["status", "error"]]
    layouts = df[["tp", "pp", "micro_batch_size", "activation_checkpointing"]].drop_duplicates()
    assert len(layouts) == 3  # no layout ran twice
    jobs = tmp_path / "results" / "tiny" / "jobs"
    assert sorted(p.name for p in jobs.iterdir()) == [f"trial-0000{i}-a1" for i in range(3)]  # one attempt each
    assert not list((tmp_path / "results" / "tiny" / "inflight").iterdir())


def test_second_run_refuses_while_the_first_holds_the_lock(tmp_path):
    spec = tiny_spec(tmp_path, max_trials=2)
    first = start_cli("run", str(spec), cwd=tmp_path)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "results" / "tiny" / "run.lock").exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        second = sweep_cli("run", str(spec), cwd=tmp_path)
        assert second.returncode == 2
        assert "another `sweep run` is running this sweep" in second.stderr
        status = sweep_cli("status", str(spec), cwd=tmp_path)  # works meanwhile
        assert status.returncode == 0
    finally:
        first.wait(timeout=300)
    assert first.returncode == 0


def test_fresh_starts_over_and_changed_spec_is_refused(tmp_path):
    spec = tiny_spec(tmp_path, max_trials=1)
    assert sweep_cli("run", str(spec), cwd=tmp_path).returncode == 0
    changed = yaml.safe_load(spec.read_text())
    changed["seq_len"] = 32
    spec.write_text(yaml.safe_dump(changed))
    r = sweep_cli("run", str(spec), cwd=tmp_path)
    assert r.returncode == 2 and "changed since" in r.stderr and "--fresh" in r.stderr
    r = sweep_cli("run", str(spec), "--fresh", cwd=tmp_path, input="n\n")
    assert r.returncode == 2 and "not confirmed" in r.stderr
    r = sweep_cli("run", str(spec), "--fresh", "--yes", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(frame(tmp_path)) == 1
