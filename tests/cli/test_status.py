"""`sweep status`: a results folder that is not there is an error, as for `sweep best`; `--results`
reads a folder given by path."""

from __future__ import annotations

from tests.cli.test_exit_codes import replay_spec
from tests.conftest import sweep_cli


def test_status_from_the_wrong_folder_says_there_are_no_results(tmp_path):
    r = sweep_cli("status", "tiny_cpu", cwd=tmp_path)  # results_dir: results, relative to here: none
    assert r.returncode == 2, r.stdout
    assert r.stderr.strip() == (
        f"error: no results under results/tiny_cpu (results_dir is relative to this folder, {tmp_path}): "
        "run `sweep run tiny_cpu` first, or give the results folder with --results DIR"
    )
    assert "0 finished" not in r.stdout
    best = sweep_cli("best", "tiny_cpu", cwd=tmp_path)
    assert best.returncode == r.returncode and best.stderr == r.stderr  # the same answer as best


def test_status_reads_a_results_folder_given_by_path(tmp_path):
    spec = replay_spec(tmp_path, "st", [{"tp": 1, "status": "ok", "mfu": 0.5}, {"tp": 2, "status": "oom", "mfu": None}])
    assert sweep_cli("run", str(spec), cwd=tmp_path).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = sweep_cli("status", "ignored", "--results", str(tmp_path / "results" / "st"), cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert "st: 2 finished, 0 running" in r.stdout and "50.00%" in r.stdout and "oom" in r.stdout
    missing = sweep_cli("status", "ignored", "--results", str(elsewhere), cwd=elsewhere)
    assert missing.returncode == 2 and f"no results under {elsewhere}" in missing.stderr
