"""A real sweep over two node counts on the local cluster of network namespaces (issue 45, item 5):
CPU ranks of a small model at 1 and 2 nodes across the shaped link, whose answer `--by time` and
`--by cost` is the same trial and node count in every output (the table, JSON, YAML, a trainer's
flags, `sweep status`, `sweep report`) and is what the trials measured: the fastest mean step by
time, the fewest node-seconds a step by cost. Root only (namespaces and tc); CI runs it."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from sweeper.launchers import netns
from tests.conftest import cli_env, sweep_cli

pytestmark = [
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root"),
]

SWEEP = {
    "name": "netns_sizes",
    "model": {"layers": 4, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn": 176, "vocab": 256},
    "seq_len": 64,
    "global_batch_size": 8,
    "cluster": {"nodes": [1, 2], "gpus_per_node": 2, "gpu": "cpu"},
    "goal": {"tokens": 1.0e9, "gpu_hour_cost": 1.0},
    "space": {"tp": [1, 2], "pp": [1], "micro_batch_size": [1], "attention": ["flash2"]},
    "trial": {"steps": 6, "warmup_steps": 1, "timeout_min": 5, "precision": "fp32"},
    "search": {"max_trials": 4, "parallel": 1, "seed": 0},
    "launcher": "local",
}


def test_a_sweep_over_two_node_counts_gives_one_answer_everywhere(tmp_path: Path) -> None:
    spec = tmp_path / "netns_sizes.yaml"
    spec.write_text(yaml.safe_dump(SWEEP | {"results_dir": str(tmp_path / "results")}))
    with netns.shaped_link("1gbit") as nodes:
        env = cli_env(SWEEP_NETNS=",".join(nodes.namespaces))
        run = sweep_cli("run", str(spec), cwd=tmp_path, env=env, timeout=1200)
        assert run.returncode == 0, run.stderr[-3000:]
    rows = pd.read_parquet(tmp_path / "results" / "netns_sizes" / "trials")
    ok = rows[rows.status == "ok"]
    assert sorted(ok.nodes.unique()) == [1, 2], rows[["trial_number", "nodes", "status", "error"]]
    truth = {
        "time": ok.loc[ok.step_time_mean_s.idxmin()],
        "cost": ok.loc[(ok.nodes * ok.step_time_mean_s).idxmin()],
    }
    for by, want in truth.items():
        trial, n = int(want.trial_number), int(want.nodes)
        doc = json.loads(sweep_cli("best", str(spec), "--by", by, "-f", "json", cwd=tmp_path).stdout)
        layout = doc["layout"]
        assert (layout["trial_number"], layout["nodes"], layout["num_devices"]) == (trial, n, 2 * n), by
        assert doc["answer"] == {"by": by, "nodes": n, "trial": trial}
        exported = yaml.safe_load(sweep_cli("best", str(spec), "--by", by, "-f", "yaml", cwd=tmp_path).stdout)
        assert (exported["trial_number"], exported["nodes"]) == (trial, n)
        flags = sweep_cli("best", str(spec), "--by", by, "-f", "megatron", cwd=tmp_path).stdout.splitlines()[0]
        assert f"trial {trial}," in flags and f"chosen for {n} node(s)" in flags
        line = f"--by {by}: {n} node(s), trial {trial},"
        assert line in sweep_cli("best", str(spec), "--by", by, cwd=tmp_path).stdout
        assert line in sweep_cli("status", str(spec), "--by", by, cwd=tmp_path).stdout
        report = sweep_cli("report", str(spec), "--by", by, cwd=tmp_path, timeout=300)
        assert report.returncode == 0, report.stderr[-2000:]
        page = html.unescape((tmp_path / "results" / "netns_sizes" / "report.html").read_text())
        assert "{1, 2}×2 cpu" in page and f"Winner --by {by} at {n} node(s): trial {trial} at " in page
        if doc["margin"] is not None:  # the runner-up is of the answer's node count
            runner = int(doc["margin"]["runner_up"])
            assert int(ok.set_index("trial_number").loc[runner, "nodes"]) == n
