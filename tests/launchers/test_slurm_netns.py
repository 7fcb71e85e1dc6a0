"""The local SLURM on the cluster of network namespaces (`SLURM_NETNS=1 scripts/slurm/start.sh` after
scripts/netns/start.sh; root, CI runs it): srun puts node k's tasks in namespace k, and a trial of two
nodes submitted through sweep's SLURM launcher all-reduces its gradients across the shaped link, where
a trial of one node leaves the link alone; on four namespaces a trial of four nodes is one job on all
of them, and `sweep profile --nodes 2` of a SLURM sweep is one SLURM job of two of them, and measures
the link."""

from __future__ import annotations

import json
import os
import re
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
launcher: {{kind: slurm, poll_s: 0.5, exclusive: false, cpus_per_task: 1}}
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


PROFILE_SWEEP = """
name: prof
model: {layers: 2, hidden: 128, heads: 4, kv_heads: 2, ffn: 352, vocab: 1024}
seq_len: 64
global_batch_size: 8
cluster: {nodes: 2, gpus_per_node: 2, gpu: cpu, link: TBF 200mbit}
space: {tp: [1, 2], pp: [1], micro_batch_size: [1]}
trial: {steps: 4, warmup_steps: 1, timeout_min: 5, precision: fp32}
launcher: {kind: slurm, poll_s: 0.5, exclusive: false, cpus_per_task: 1}
"""
# cpus_per_task 1: the local SLURM advertises 4 CPUs a node on a machine of fewer cores; its default
# (2 a task, OMP_NUM_THREADS 2) would run the reference step's 4 ranks on twice the threads the
# profile measured them with (its cores shared among its ranks: 1 each here)


def test_four_nodes_a_trial_across_all_and_a_profile_of_two(slurm_cluster, tmp_path: Path) -> None:
    """On four SLURM nodes that are four namespaces (a star: node 0 forwards between the others): a
    trial of four nodes of one rank is one job on all four, its gradients all-reduced across the links;
    and `sweep profile --nodes 2` of a sweep whose launcher is SLURM is one job of 2 nodes x 2 tasks on
    two of them; its collectives across nodes run at the link's rate, the profile names the link the
    sweep does (no tc to read on a real cluster), and its reference step is a job per depth on the same
    nodes."""
    from sweeper.profiles.profile import load_profile

    spec, out = tmp_path / "prof.yaml", tmp_path / "p.yaml"
    spec.write_text(PROFILE_SWEEP)
    with netns.shaped_link("200mbit", nodes=4), on_namespaces(slurm_cluster) as cluster:
        assert cluster.nodes == tuple(f"sweep-node{k}" for k in range(4)), cluster
        four, tx, rx = run_trial(tmp_path, "four", nodes=4, ranks=1)
        done = sweep_cli("profile", str(spec), "--nodes", "2", "--quick", "--out", str(out), cwd=tmp_path, timeout=600)
    assert four.status == "ok" and four.nodelist == "sweep-node[0-3]" and four.dp == 4, four.error
    grads = 4 * load_sweep(tmp_path / "four.yaml", profiles=False).model.num_params
    # node 1 is in gloo's ring of four: it sends 2 (n-1)/n G = 1.5 G a step, and forwards nothing (node 0 does)
    assert tx >= 1.5 * STEPS * grads and rx >= 1.5 * STEPS * grads, (tx, rx, grads)
    print(done.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "measuring on 2 processes on each of 2 nodes (one SLURM job; link TBF 200mbit)" in done.stderr
    # the profile's job, then one job per depth of the reference step: each on the same two of the four nodes
    ran = re.findall(r"SLURM job \d+ ran on (sweep-node\[\d[-,]\d\])", done.stderr)
    assert len(ran) == 3 and len(set(ran)) == 1, done.stderr[-3000:]
    assert "collectives across 2 nodes" in done.stderr  # rank 0's own progress lines, followed from its log
    p = load_profile(out, gpu="cpu", link="tbf 200Mbit")
    assert (p.nodes, p.shared_host, p.link, p.processes) == (2, True, "TBF 200mbit", 4)
    inter = [c for c in p.collectives if c.scope == "inter"]
    assert {(c.op, c.per_node) for c in inter} >= {(op, q) for op in ("all_reduce", "send_recv") for q in (1, 2)}
    # as tests/launchers/test_netns.py across the local launcher's namespaces: both ranks of node 0 send at once
    big = max((c for c in inter if c.op == "send_recv" and c.per_node == 1), key=lambda c: c.bytes)
    rate = 2 * big.bytes / big.seconds
    inside = max((c for c in p.collectives if c.scope == "intra" and c.op == "send_recv"), key=lambda c: c.bytes)
    print(
        f"send/recv of {big.bytes} B: across the link {rate / 1e6:.1f} MB/s, within node 0 {inside.bytes / inside.seconds / 1e6:.0f} MB/s"
    )
    assert 0.5 * 25e6 < rate < 1.1 * 25e6, f"send/recv across a 200mbit link at {rate / 1e6:.1f} MB/s"
    assert inside.bytes / inside.seconds > 3 * rate
    assert p.processes > p.cpus and len(p.reference_steps) == 2, done.stderr[-3000:]
    for r in p.reference_steps:
        print(f"reference step at {r.passes} block passes: {r.measured_s:.3g} s measured, {r.predicted_s:.3g} s priced")
    assert "reference step: 10 real steps of the built-in trainer" in done.stderr
    assert not list(tmp_path.glob(".sweep-profile-*")), "the job's folder is removed after it"
