"""The local SLURM on the cluster of network namespaces (`SLURM_NETNS=1 scripts/slurm/start.sh` after
scripts/netns/start.sh; root, CI runs it): srun puts node k's tasks in namespace k, and a trial of two
nodes submitted through sweep's SLURM launcher all-reduces its gradients across the shaped link, where
a trial of one node leaves the link alone."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from sweeper.launchers import netns
from sweeper.spec.loader import load_sweep
from tests.conftest import sweep_cli
from tests.slurm_cluster import on_namespaces

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.netns,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root"),
]

STEPS = 4
SWEEP = f"""
name: NAME
model: {{layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 176, vocab: 256}}
seq_len: 64
global_batch_size: 8
cluster: {{nodes: NODES, gpus_per_node: RANKS, gpu: cpu}}
space: {{tp: [1], pp: [1], micro_batch_size: [1], attention: [sdpa_math]}}
trial: {{steps: {STEPS}, warmup_steps: 1, timeout_min: 5, precision: fp32}}
search: {{max_trials: 1, parallel: 1, seed: 0}}
launcher: {{kind: slurm, poll_s: 0.5, exclusive: false}}
"""


def link_bytes() -> tuple[int, int]:
    """Bytes node 1's end of the shaped link has sent and received (the kernel's counters, read in its namespace)."""
    out = subprocess.run(
        ["ip", "-n", "sweep-node1", "-s", "-j", "link", "show", "sw-node1"], capture_output=True, text=True, check=True
    ).stdout
    stats = json.loads(out)[0]["stats64"]
    return stats["tx"]["bytes"], stats["rx"]["bytes"]


def run_trial(tmp_path: Path, name: str, nodes: int, ranks: int) -> tuple[pd.Series, int, int]:
    """One trial of data parallelism over `nodes` x `ranks` through the SLURM launcher: its row, and the
    bytes node 1's end of the link sent and received meanwhile."""
    spec = tmp_path / f"{name}.yaml"
    text = SWEEP.replace("NAME", name).replace("NODES", str(nodes)).replace("RANKS", str(ranks))
    spec.write_text(text + f"results_dir: {tmp_path / 'results'}\n")
    tx, rx = link_bytes()
    done = sweep_cli("run", str(spec), cwd=tmp_path, timeout=300)
    tx2, rx2 = link_bytes()
    assert done.returncode == 0, done.stderr[-3000:]
    row = pd.read_parquet(tmp_path / "results" / name / "trials").iloc[0]
    return row, tx2 - tx, rx2 - rx


def test_a_trial_of_two_nodes_all_reduces_across_the_shaped_link(slurm_cluster, tmp_path: Path) -> None:
    with netns.shaped_link("1gbit"), on_namespaces(slurm_cluster) as cluster:
        assert cluster.nodes == ("sweep-node0", "sweep-node1"), cluster
        placed = subprocess.run(
            ["srun", "-N2", "-n2", "-l", "ip", "netns", "identify"], capture_output=True, text=True, timeout=60
        )
        assert sorted(placed.stdout.splitlines()) == ["0: sweep-node0", "1: sweep-node1"], placed
        across, tx, rx = run_trial(tmp_path, "across", nodes=2, ranks=1)
        within, tx1, rx1 = run_trial(tmp_path, "within", nodes=1, ranks=2)
    assert across.status == "ok" and across.nodelist == "sweep-node[0-1]" and across.dp == 2, across.error
    assert within.status == "ok" and within.nodelist in cluster.nodes and within.dp == 2, within.error
    # an all-reduce of G bytes over 2 ranks sends at least 2 (n-1)/n G = G from each rank (gloo's ring: G/2
    # in its reduce-scatter, G/2 in its all-gather), once per step (gradient accumulation without a sync)
    grads = 4 * load_sweep(tmp_path / "across.yaml", profiles=False).model.num_params  # fp32 gradients
    print(
        f"gradients {grads} B x {STEPS} steps; across two nodes node 1's link sent {tx} B ({tx / grads:.2f} G), "
        f"received {rx} B ({rx / grads:.2f} G); within one node {tx1} B, {rx1} B"
    )
    assert tx >= STEPS * grads and rx >= STEPS * grads
    assert tx1 + rx1 < 0.05 * STEPS * grads  # the same all-reduce over one node's loopback: SLURM's own chatter at most
