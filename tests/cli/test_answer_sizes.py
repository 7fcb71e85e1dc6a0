"""One measured answer over node counts in every output (issue 45): `sweep best` as a table, JSON,
YAML and a trainer's flags, its noise and tie lines, `sweep run`'s closing lines, `sweep status` and
`sweep compare` all name the same trial and node count for a `--by`, and a noise line compares only
trials of that node count.

The sweep is replayed from a table over 8, 16 and 32 nodes whose answer is known: per step 20 s at
8 nodes, 12 s at 16 and 7 s at 32 (each size's other layouts 2 % slower each), so `--by time` is
32 nodes (the fastest run), `--by cost` 8 nodes (8 x 20 = 160 node-seconds a step against 192 and
224), and the highest MFU of all (the per-GPU measure the old outputs ranked by) is at 8 nodes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sweeper.plan.plan import Plan
from tests.conftest import sweep_cli
from tests.sizes_replay import SIZES, write_sizes_sweep

STEP_S = {8: 20.0, 16: 12.0, 32: 7.0}
GOAL = {"tokens": 1.0e12, "gpu_hour_cost": 2.0}


def _step(plan: Plan, row: int, nodes: int, i: int) -> float:
    return STEP_S[nodes] * (1 + 0.02 * i)


@pytest.fixture(scope="module")
def sized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str, pd.DataFrame]:
    """The replayed sweep: its folder, sweep file, what `sweep run` printed (stdout, then the live
    lines of stderr) and its result rows."""
    tmp = tmp_path_factory.mktemp("sizes")
    path = write_sizes_sweep(tmp, GOAL, _step)
    r = sweep_cli("run", str(path), cwd=tmp, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = pd.read_parquet(tmp / "results" / "sizes" / "trials")
    return tmp, path, r.stdout + r.stderr, rows


def _nodes_of(rows: pd.DataFrame) -> dict[int, int]:
    return dict(zip(rows.trial_number.astype(int), rows.nodes.astype(int)))


def _noise_trials(text: str) -> list[list[int]]:
    """The trial numbers each noise or tie line names."""
    lines = [s for s in text.splitlines() if re.search(r"\b(tie within noise|win beyond noise|leads trial)\b", s)]
    return [[int(t) for t in re.findall(r"\btrial (\d+)", s, re.I)] for s in lines]


@pytest.mark.parametrize(("by", "nodes"), [("time", 32), ("cost", 8)])
def test_every_format_names_one_trial_and_node_count(sized, by, nodes):
    tmp, path, _, rows = sized
    assert sorted(rows.nodes.unique()) == list(SIZES) and rows.groupby("nodes").size().min() >= 2
    at = rows[rows.nodes == nodes]
    want = int(at.loc[at.step_time_mean_s.idxmin(), "trial_number"])  # the fastest run at that size

    doc = json.loads(sweep_cli("best", str(path), "--by", by, "-f", "json", cwd=tmp).stdout)
    layout = doc["layout"]
    assert (layout["trial_number"], layout["nodes"], layout["num_devices"]) == (want, nodes, 8 * nodes)
    assert doc["best"]["trial_number"] == want and doc["top"][0]["trial_number"] == want
    assert {int(r["nodes"]) for r in doc["top"]} == {nodes}  # ranked among its own size only
    assert doc["per_nodes"]["winner_nodes"] == nodes and doc["answer"] == {"by": by, "nodes": nodes, "trial": want}

    exported = yaml.safe_load(sweep_cli("best", str(path), "--by", by, "-f", "yaml", cwd=tmp).stdout)
    assert (exported["trial_number"], exported["nodes"], exported["num_devices"]) == (want, nodes, 8 * nodes)
    flags = sweep_cli("best", str(path), "--by", by, "-f", "megatron", cwd=tmp).stdout.splitlines()[0]
    assert f"trial {want}," in flags and f"chosen for {nodes} node(s)" in flags

    table = sweep_cli("best", str(path), "--by", by, cwd=tmp).stdout
    assert f"--by {by}: {nodes} node(s), trial {want}," in table
    assert f"best layouts at {nodes} node(s) (--by {by})" in table
    first = [m.group(1) for m in re.finditer(r"^│\s*1\s*│\s*(\d+)\s*│", table, re.M)]  # the top table's first row
    assert first == [str(want)], table


@pytest.mark.parametrize(("by", "nodes"), [("time", 32), ("cost", 8)])
def test_noise_lines_compare_trials_of_the_answers_node_count(sized, by, nodes):
    tmp, path, _, rows = sized
    size = _nodes_of(rows)
    table = sweep_cli("best", str(path), "--by", by, cwd=tmp).stdout
    named = _noise_trials(table)
    assert named, table
    assert all(size[t] == nodes for pair in named for t in pair), (named, size)
    doc = json.loads(sweep_cli("best", str(path), "--by", by, "-f", "json", cwd=tmp).stdout)
    assert size[doc["margin"]["winner"]] == nodes and size[doc["margin"]["runner_up"]] == nodes
    assert doc["margin"]["winner"] == doc["layout"]["trial_number"]
    export = sweep_cli("best", str(path), "--by", by, "-f", "megatron", cwd=tmp)
    assert all(size[t] == nodes for pair in _noise_trials(export.stderr) for t in pair), export.stderr


def test_run_status_and_compare_close_on_the_same_answer(sized):
    tmp, path, printed, rows = sized
    size = _nodes_of(rows)
    at = rows[rows.nodes == 32]
    want = int(at.loc[at.step_time_mean_s.idxmin(), "trial_number"])
    assert f"--by time: 32 node(s), trial {want}," in printed
    assert "best layouts at 32 node(s) (--by time)" in printed
    assert all(size[t] == 32 for pair in _noise_trials(printed) for t in pair), printed
    for t, n in size.items():  # each live line names the node count its trial ran at
        assert re.search(rf"^trial +{t} +ok +nodes={n} ", printed, re.M), printed
    status = sweep_cli("status", str(path), cwd=tmp).stdout
    assert f"--by time: 32 node(s), trial {want}," in status
    cost = sweep_cli("status", str(path), "--by", "cost", cwd=tmp).stdout
    assert "--by cost: 8 node(s), trial" in cost
    across = sweep_cli("compare", str(path), cwd=tmp)
    assert f"--by time: 32 node(s), trial {want}," in across.stdout, across.stderr
    doc = json.loads(sweep_cli("compare", str(path), "-f", "json", cwd=tmp).stdout)
    assert doc["answer"] == {"by": "time", "nodes": 32, "trial": want}
