"""The CLI as scripts drive it: exit codes of a sweep with no success, `--top 0`, piped output, help."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from sweeper.errors import NoSuccessError
from tests.conftest import sweep_cli

NO_SUCCESS_EXIT = NoSuccessError.exit_code


def replay_spec(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    """A sweep over tp answered at once by the replay launcher from `rows`."""
    table = tmp_path / f"{name}.csv"
    pd.DataFrame(rows).to_csv(table, index=False)
    spec = {
        "name": name,
        "model": {"layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn": 5632, "vocab": 32000},
        "seq_len": 4096,
        "global_batch_size": 512,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": {"tp": sorted({r["tp"] for r in rows})},
        "search": {"max_trials": len(rows), "parallel": 1},
        "launcher": {"kind": "replay", "table": str(table)},
        "results_dir": str(tmp_path / "results"),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


FAILURES = [{"tp": 1, "status": "oom", "mfu": None}, {"tp": 2, "status": "failed", "mfu": None, "error": "boom"}]


def test_no_successful_trial_exits_the_same_non_zero_code_everywhere(tmp_path):
    spec = replay_spec(tmp_path, "allfail", FAILURES)
    run = sweep_cli("run", str(spec), cwd=tmp_path)
    assert run.returncode == NO_SUCCESS_EXIT == 1, run.stderr
    assert run.stderr.strip().splitlines()[-1] == "error: no trial succeeded (2 finished)"
    codes = {
        fmt: sweep_cli("best", str(spec), "--format", fmt, cwd=tmp_path).returncode
        for fmt in ("table", "json", "yaml", "torchtitan", "megatron")
    }
    assert codes == dict.fromkeys(codes, NO_SUCCESS_EXIT)
    # a sweep with a success: 0 for run and every format
    good = replay_spec(tmp_path, "good", [{"tp": 1, "status": "ok", "mfu": 0.5}, *FAILURES[1:]])
    assert sweep_cli("run", str(good), cwd=tmp_path).returncode == 0
    for fmt in ("table", "json", "yaml", "torchtitan", "megatron"):
        assert sweep_cli("best", str(good), "--format", fmt, cwd=tmp_path).returncode == 0, fmt


@pytest.mark.parametrize("command", ["best", "run"])
def test_top_zero_is_a_usage_error(tmp_path, command):
    spec = replay_spec(tmp_path, "t", [{"tp": 1, "status": "ok", "mfu": 0.5}])
    r = sweep_cli(command, str(spec), "--top", "0", cwd=tmp_path)
    assert r.returncode == 2 and "--top" in r.stderr
    assert not (tmp_path / "results" / "t").exists()  # nothing ran


def test_piped_run_ends_the_progress_panel_before_the_table(tmp_path):
    spec = replay_spec(tmp_path, "piped", [{"tp": 1, "status": "ok", "mfu": 0.5}, *FAILURES[1:]])
    r = sweep_cli("run", str(spec), cwd=tmp_path, merge_stderr=True)  # as `sweep run ... 2>&1 | cat`
    lines = r.stdout.splitlines()
    title = [i for i, line in enumerate(lines) if "piped: best layouts" in line]
    assert title and lines[title[0]].strip() == "piped: best layouts", lines  # on a line of its own
    assert lines[title[0] - 1].strip().startswith("failures"), lines  # right after the panel's last line


def test_flags_show_as_flags_in_help(tmp_path):
    r = sweep_cli("run", "--help", cwd=tmp_path)
    flag_lines = [
        line
        for line in r.stdout.splitlines()
        if any(line.lstrip("│ ").startswith(f) for f in ("--dry-run", "--fresh", "--json", "--yes"))
    ]
    assert len(flag_lines) == 4 and not [line for line in flag_lines if "<bool>" in line], flag_lines
