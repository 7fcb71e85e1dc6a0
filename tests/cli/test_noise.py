"""Noise through the commands: recorded step times replayed through `sweep run`; two winners whose
intervals overlap are a tie in `sweep run`, `sweep best` (table, JSON, an export's note) and the
report, a clear win is not, and a stopped-early trial has its own section of the report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import sweep_cli

# 9 measured steps after one warm-up step (the 10-step protocol), 8x8 H100s: a 1.4B model
NOISY_A = [9.0, 5.3, 4.6, 5.2, 4.7, 5.4, 4.8, 5.1, 4.6, 5.3]  # mean 5.0 s, spread 7 % of the mean
NOISY_B = [9.0, 5.4, 4.8, 5.3, 4.9, 5.5, 4.9, 5.3, 4.8, 5.5]  # mean 5.156 s: 3 % slower, within the noise
STEADY = [9.0, 6.0, 6.02, 5.98, 6.01, 5.99, 6.0, 6.02, 5.98, 6.0]  # mean 6.0 s, tight: clearly slower than A
STOPPED = [9.0, 15.0, 15.2]  # stopped after its first measured steps

TABLE = [
    {"tp": 1, "micro_batch_size": 2, "status": "ok", "step_times_s": NOISY_A},
    {"tp": 1, "micro_batch_size": 1, "status": "ok", "step_times_s": NOISY_B},
    {"tp": 2, "micro_batch_size": 2, "status": "ok", "step_times_s": STEADY},
    {
        "tp": 2,
        "micro_batch_size": 1,
        "status": "stopped_early",
        "step_times_s": STOPPED,
        "error": "stopped early after 3 of 10 steps",
    },
]


def replayed(tmp_path: Path, name: str, space: dict) -> Path:
    """A sweep over `space` answered by the replay launcher from TABLE (a Parquet file: lists in cells)."""
    table = tmp_path / "table.parquet"
    pd.DataFrame(TABLE).to_parquet(table)
    spec = {
        "name": name,
        "model": {"layers": 16, "hidden": 2048, "heads": 16, "kv_heads": 8, "ffn": 5632, "vocab": 32000},
        "seq_len": 4096,
        "global_batch_size": 512,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "h100-sxm"},
        "space": {"pp": [1], **space},
        "search": {"max_trials": 4, "parallel": 1, "seed": 0},
        "launcher": {"kind": "replay", "table": str(table)},
        "results_dir": str(tmp_path / "results"),
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


TIE_LINE = re.compile(
    r"^A tie within noise: trial (\d+) \(\d+\.\d\d% MFU, interval [\d.]+% to [\d.]+%\) and trial (\d+) .* "
    r"overlap \(95% t interval of the mean step time, 9 measured steps\); to settle it: about (\d+) measured steps "
    r"each \(trial\.steps: (\d+)\), if their means and spreads hold, or a repeat of both layouts",
    re.M,
)


@pytest.fixture(scope="module")
def tie(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The sweep of all four rows, run once: A and B (the best two) overlap, and one trial stopped early."""
    tmp = tmp_path_factory.mktemp("tie")
    path = replayed(tmp, "tie", {"tp": [1, 2], "micro_batch_size": [1, 2]})
    r = sweep_cli("run", str(path), cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return path, r.stdout


def test_overlapping_winners_are_a_tie_in_run_and_best(tie):
    path, run_out = tie
    m = TIE_LINE.search(run_out)
    assert m, run_out  # the run's final summary says it
    steps, total = int(m.group(3)), int(m.group(4))
    assert steps > 9 and total == steps + 1  # more steps than the 9 measured, plus the warm-up step
    best = sweep_cli("best", str(path), cwd=path.parent, timeout=120)
    assert best.returncode == 0, best.stderr
    line = TIE_LINE.search(best.stdout)
    assert line and line.group(0) == m.group(0)
    # the table gives each trial its MFU interval: the winner's low end under the runner-up's high end
    cells = re.findall(r"│ (\d+\.\d\d)–(\d+\.\d\d)% │", best.stdout)
    assert len(cells) == 3 and float(cells[0][0]) < float(cells[1][1])
    doc = json.loads(sweep_cli("best", str(path), "--format", "json", cwd=path.parent, timeout=120).stdout)
    assert doc["margin"]["verdict"] == "tie" and doc["margin"]["steps_to_settle"] == steps
    assert doc["best"]["steps_measured"] == 9 and doc["best"]["mfu_low"] < doc["top"][1]["mfu_high"]
    export = sweep_cli("best", str(path), "--format", "megatron", cwd=path.parent, timeout=120)
    assert export.returncode == 0 and "--tensor-model-parallel-size 1" in export.stdout
    assert "note: A tie within noise: trial" in export.stderr  # the exported layout is one of two


def test_the_report_says_tie_and_gives_stopped_early_trials_their_own_section(tie):
    path, _ = tie
    r = sweep_cli("report", str(path), cwd=path.parent, timeout=300)
    assert r.returncode == 0, r.stderr
    page = (path.parent / "results" / "tie" / "report.html").read_text()
    assert re.search(
        r"Margin over the runner-up \(trial \d+, [\d.]+% MFU, interval [\d.]+% to [\d.]+%\): none beyond noise, a tie within noise: the winner measured 3\.1% faster",
        page,
    )
    assert "about" in page and "measured steps each" in page and "a repeat of both layouts" in page
    stopped = re.search(r"<h2>Stopped early \(1, [\d.]+ GPU-hours saved\)</h2>.*?</table>", page, re.S)
    assert stopped and "<td>tp=2 mbs=1 dp=32</td><td>3</td>" in stopped.group(0)  # layout, steps run
    winner_mfu = float(re.search(r"Winner: trial \d+ at ([\d.]+)% MFU", page).group(1))
    assert f"<td>{winner_mfu * 5.0 / 15.1:.2f}%</td>" in stopped.group(0)  # the MFU of its 2 measured steps
    assert "<h2>Failures</h2><p>None: no trial failed.</p>" in page  # the stopped trial is not a failure
    assert "<th>MFU 95%</th>" in page
    assert re.search(r"#2 trial \d+ \(tp=1 mbs=1 dp=64\): .*?\(\+3\.1% measured, within noise\)", page)


def test_a_clear_win_is_not_a_tie(tmp_path):
    path = replayed(tmp_path, "win", {"tp": [1, 2], "micro_batch_size": [2]})  # A against the steady, slower one
    run = sweep_cli("run", str(path), cwd=tmp_path, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    best = sweep_cli("best", str(path), cwd=tmp_path, timeout=120)
    assert best.returncode == 0, best.stderr
    assert "tie within noise" not in run.stdout + best.stdout
    line = re.search(
        r"^A win beyond noise: trial \d+ leads trial \d+ by 20\.0% \((\d+\.\d)% to (\d+\.\d)% between",
        best.stdout,
        re.M,
    )
    assert line and 0 < float(line.group(1)) < 20 < float(line.group(2)), best.stdout
    assert sweep_cli("report", str(path), cwd=tmp_path, timeout=300).returncode == 0
    page = (tmp_path / "results" / "win" / "report.html").read_text()
    assert "a win beyond noise" in page and "tie within noise" not in page
    assert "Stopped early" not in page
