"""The local SLURM on the cluster of network namespaces (`SLURM_NETNS=1 scripts/slurm/start.sh` after
scripts/netns/start.sh; root, CI runs it): srun puts node k's tasks in namespace k; a trial of four nodes
submitted through sweep's SLURM launcher is one job on all of them and all-reduces its gradients across
the shaped links, where a trial of one node leaves them alone; and `sweep profile --nodes 2` of a SLURM
sweep is one SLURM job of two of them, and measures the link. The cluster is remade on the namespaces
once, for all the tests of this module (a fixture): each remaking restarts SLURM twice."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

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
LINKED = (1, 2, 3)  # the nodes whose link to the hub (node 0) is theirs alone
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


def link_bytes(node: int) -> tuple[int, int]:
    """Bytes node k's end of its shaped link (k >= 1: node 0 is the star's hub) has sent and received
    (the kernel's counters, read in its namespace)."""
    out = subprocess.run(
        ["ip", "-n", f"sweep-node{node}", "-s", "-j", "link", "show", f"sw-node{node}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    stats = json.loads(out)[0]["stats64"]
    return stats["tx"]["bytes"], stats["rx"]["bytes"]


def run_trial(tmp_path: Path, name: str, nodes: int, ranks: int) -> tuple[pd.Series, dict[int, tuple[int, int]]]:
    """One trial of data parallelism over `nodes` x `ranks` through the SLURM launcher: its row, and the
    bytes each shaped link's node end (nodes 1-3 of the star) sent and received meanwhile."""
    spec = tmp_path / f"{name}.yaml"
    text = SWEEP.replace("NAME", name).replace("NODES", str(nodes)).replace("RANKS", str(ranks))
    spec.write_text(text + f"results_dir: {tmp_path / 'results'}\n")
    before = {k: link_bytes(k) for k in LINKED}
    done = sweep_cli("run", str(spec), cwd=tmp_path, timeout=300)
    after = {k: link_bytes(k) for k in LINKED}
    assert done.returncode == 0, done.stderr[-3000:]
    row = pd.read_parquet(tmp_path / "results" / name / "trials").iloc[0]
    return row, {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in LINKED}


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


@pytest.fixture(scope="module")
def four_nodes(slurm_cluster, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Four SLURM nodes that are four namespaces (a star: node 0 forwards between the others), remade
    once for every test here: srun's placement of a task per node, a trial of one node of two ranks, a
    trial of four nodes of one rank, and `sweep profile --nodes 2` of a sweep whose launcher is SLURM."""
    tmp_path = tmp_path_factory.mktemp("slurm_netns")
    spec, out = tmp_path / "prof.yaml", tmp_path / "p.yaml"
    spec.write_text(PROFILE_SWEEP)
    with netns.shaped_link("200mbit", nodes=4), on_namespaces(slurm_cluster) as cluster:
        placed = subprocess.run(
            ["srun", "-N4", "-n4", "-l", "ip", "netns", "identify"], capture_output=True, text=True, timeout=60
        )
        within, within_links = run_trial(tmp_path, "within", nodes=1, ranks=2)
        four, four_links = run_trial(tmp_path, "four", nodes=4, ranks=1)
        done = sweep_cli("profile", str(spec), "--nodes", "2", "--quick", "--out", str(out), cwd=tmp_path, timeout=600)
    print(done.stderr)
    return {
        "dir": tmp_path,
        "cluster": cluster,
        "placed": placed,
        "within": (within, within_links),
        "four": (four, four_links),
        "profile": (done, out),
    }


def test_srun_puts_node_k_tasks_in_namespace_k(four_nodes: dict[str, Any]) -> None:
    assert four_nodes["cluster"].nodes == tuple(f"sweep-node{k}" for k in range(4)), four_nodes["cluster"]
    placed = four_nodes["placed"]
    assert sorted(placed.stdout.splitlines()) == [f"{k}: sweep-node{k}" for k in range(4)], placed


def test_a_trial_of_four_nodes_all_reduces_across_the_links_and_one_of_one_node_leaves_them_alone(
    four_nodes: dict[str, Any],
) -> None:
    """A trial of four nodes of one rank is one job on all four, its gradients all-reduced across the
    links; the same all-reduce over one node's two ranks stays on that node's loopback."""
    tmp_path = four_nodes["dir"]
    (four, links), (within, quiet) = four_nodes["four"], four_nodes["within"]
    assert four.status == "ok" and four.nodelist == "sweep-node[0-3]" and four.dp == 4, four.error
    assert within.status == "ok" and within.nodelist in four_nodes["cluster"].nodes and within.dp == 2, within.error
    grads = 4 * load_sweep(tmp_path / "four.yaml", profiles=False).model.num_params  # fp32 gradients
    print(f"gradients {grads} B x {STEPS} steps; four nodes: links {links}; one node: links {quiet}")
    # node 1 is in gloo's ring of four: it sends 2 (n-1)/n G = 1.5 G a step, and forwards nothing (node 0 does)
    tx, rx = links[1]
    assert tx >= 1.5 * STEPS * grads and rx >= 1.5 * STEPS * grads, (tx, rx, grads)
    # every byte between two nodes crosses a non-hub node's link: one node's all-reduce crosses none
    # (SLURM's own chatter at most)
    assert sum(t + r for t, r in quiet.values()) < 0.05 * STEPS * grads, quiet


def test_a_profile_of_two_nodes_is_one_slurm_job_and_measures_the_link(four_nodes: dict[str, Any]) -> None:
    """`sweep profile --nodes 2` of a sweep whose launcher is SLURM is one job of 2 nodes x 2 tasks on two
    of the four; its collectives across nodes run at the link's rate, the profile names the link the
    sweep does (no tc to read on a real cluster), and its reference step is a job per depth on the same
    nodes."""
    from sweeper.profiles.profile import load_profile

    done, out = four_nodes["profile"]
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
    assert not list(four_nodes["dir"].glob(".sweep-profile-*")), "the job's folder is removed after it"
