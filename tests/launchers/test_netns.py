"""The two-node cluster on one machine (scripts/netns/start.sh): the link is shaped as asked, the
loopback inside a node is not, a trial's ranks run across it, and stop leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeper.errors import SweepError
from sweeper.launchers import netns
from sweeper.launchers.ranks import launch

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root"),
]


def test_link_is_shaped_and_the_loopback_is_not() -> None:
    with netns.shaped_link("200mbit") as nodes:
        assert netns.existing() == ("sweep-node0", "sweep-node1")
        assert netns.link_description(nodes) == "tbf 200Mbit"
        want = netns.rate_bytes_per_s("200mbit")
        across = netns.tcp_rate(nodes, sender=1, receiver=0, nbytes=int(want * 0.6))
        inside = netns.tcp_rate(nodes, sender=0, receiver=0, nbytes=int(want * 3))
    print(f"across {across / 1e6:.1f} MB/s, inside {inside / 1e6:.0f} MB/s")
    assert abs(across / want - 1.0) <= 0.2, f"measured {across / 1e6:.1f} MB/s across a 200mbit link"
    assert inside > 5 * across
    assert netns.existing() == ()


def test_stop_is_idempotent_and_bad_arguments_are_named() -> None:
    netns.stop()
    netns.stop()
    assert netns.existing() == ()
    with pytest.raises(SweepError, match="--link-rate 3 bits"):
        netns.start("3 bits")
    with pytest.raises(SweepError, match="--link-delay soon"):
        netns.start("1gbit", "soon")
    bad = subprocess.run([str(netns.SCRIPTS / "start.sh"), "fast"], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and "RATE must be like" in bad.stderr
    assert netns.existing() == ()


def test_environment_names_missing_namespaces() -> None:
    with pytest.raises(SweepError, match="SWEEP_NETNS: no network namespace sweep-node0, sweep-node7"):
        netns.local_nodes({"SWEEP_NETNS": "sweep-node0,sweep-node7"})
    assert netns.local_nodes({}) is None


@pytest.mark.parametrize("fork", ["1", "0"], ids=["forked-then-setns", "ip-netns-exec"])
def test_ranks_of_each_node_run_in_its_namespace(tmp_path: Path, fork: str) -> None:
    """Two ranks per node: each reports the namespace it runs in and its peers' (all-gather over gloo
    across the link), so node k's ranks are in sweep-node<k> and meet at node 0's address; whether the
    zygote forked them (each entered its node's namespace after the fork) or each was started afresh."""
    with netns.shaped_link("1gbit") as nodes:
        task = {"kind": "call", "target": "tests.ranks_targets:report_netns", "kwargs": {}}
        env = {"SWEEP_FORK_RANKS": fork}
        done = launch(task, nprocs=2, timeout_s=120, workdir=tmp_path, nodes=nodes, extra_env=env)
    assert (done.workdir / "logs" / "zygote.log").exists() == (fork == "1")
    assert done.returncodes == [0, 0, 0, 0], [done.log_tail(r) for r in range(4)]
    got = (done.out_dir / "netns.txt").read_text().split()
    assert got == ["sweep-node0", "sweep-node0", "sweep-node1", "sweep-node1"]


def test_a_task_a_scheduler_starts_in_a_namespace_meets_the_others_across_the_link() -> None:
    """A SLURM task on node sweep-node<k> (SLURM_NETNS=1 scripts/slurm/start.sh): gloo on the node's veth,
    MASTER_ADDR (submitit's: the job's first node name) the address of that node; a GLOO_SOCKET_IFNAME
    the task already has is kept; outside the namespaces nothing changes."""
    probe = "import json, sys; from sweeper.launchers import netns; print(json.dumps(netns.scheduled_node_environ(json.loads(sys.argv[1]))))"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def inside(ns: str, environ: dict[str, str]) -> dict[str, str]:
        argv = ["nsenter", f"--net=/run/netns/{ns}", sys.executable, "-c", probe, json.dumps(environ)]
        return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout)

    assert netns.scheduled_node_environ({"MASTER_ADDR": "sweep-node0"}) == {}
    with netns.shaped_link("1gbit"):
        assert inside("sweep-node1", {"MASTER_ADDR": "sweep-node0"}) == {
            "GLOO_SOCKET_IFNAME": "sw-node1",
            "MASTER_ADDR": "10.77.0.1",
        }
        assert inside("sweep-node0", {"MASTER_ADDR": "sweep-node1", "GLOO_SOCKET_IFNAME": "eth9"}) == {
            "MASTER_ADDR": "10.77.1.2"
        }
        assert inside("sweep-node0", {"MASTER_ADDR": "10.1.2.3"}) == {"GLOO_SOCKET_IFNAME": "sw-hub1"}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


SWEEP = """
name: net
model: {layers: 2, hidden: 128, heads: 4, kv_heads: 2, ffn: 352, vocab: 1024}
seq_len: 64
global_batch_size: 8
cluster: {nodes: 2, gpus_per_node: 2, gpu: cpu}
space: {tp: [1, 2], pp: [1, 2], micro_batch_size: [1, 2], sharding: [none, zero1]}
trial: {steps: 4, warmup_steps: 1, timeout_min: 5, precision: fp32}
launcher: local
"""


@pytest.mark.slow
def test_profile_across_two_nodes_measures_the_link(tmp_path: Path) -> None:
    """`sweep profile --nodes 2`: one job over both namespaces; the collectives across the link in
    groups of 1 and 2 ranks of each node (every rank taking part), named by algorithm, run at the
    link's rate (not the loopback's)."""
    from sweeper.profiles.profile import load_profile

    (tmp_path / "s.yaml").write_text(SWEEP)
    out = tmp_path / "p.yaml"
    with netns.shaped_link("200mbit"):
        done = subprocess.run(
            [sys.executable, "-m", "sweeper.cli", "profile", str(tmp_path / "s.yaml"), "--nodes", "2", "--quick"]
            + ["--out", str(out)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    p = load_profile(out, gpu="cpu")
    assert (p.nodes, p.shared_host, p.link) == (2, True, "tbf 200Mbit")
    # 4 ranks on this machine's cores: real steps of the trainer on them, beside their price
    assert p.processes > p.cpus and len(p.reference_steps) == 2, done.stderr[-2000:]
    assert [(r.layout, r.passes) for r in p.reference_steps] == [
        (f"dp=4, 2 micro-batches of 1, {k} of the model's 2 blocks", 2 * k) for k in (1, 2)
    ]
    assert "reference step: 10 real steps of the built-in trainer" in done.stderr
    inter = [c for c in p.collectives if c.scope == "inter"]
    assert {(c.op, c.per_node) for c in inter} >= {(op, q) for op in ("all_reduce", "send_recv") for q in (1, 2)}
    assert {c.algorithm for c in inter if c.op == "all_reduce"} == {"gloo ring"}
    # both ranks of node 0 send at once (two pairs at q=1, one group's first half at q=2): they share the
    # link, so together they move at most its rate, and one alone (the other late, on a busy machine) too
    big = max((c for c in inter if c.op == "send_recv" and c.per_node == 1), key=lambda c: c.bytes)
    rate = 2 * big.bytes / big.seconds
    assert rate > 0.5 * 25e6 and big.bytes / big.seconds < 1.1 * 25e6, (
        f"send/recv across a 200mbit link at {rate / 1e6:.1f} MB/s for two senders"
    )
    inside = max((c for c in p.collectives if c.scope == "intra" and c.op == "send_recv"), key=lambda c: c.bytes)
    assert inside.bytes / inside.seconds > 3 * rate
    _refuses_another_link(tmp_path, out)
    # with no namespaces there is nothing to run on: one line, exit 2
    bad = subprocess.run(
        [sys.executable, "-m", "sweeper.cli", "profile", str(tmp_path / "s.yaml"), "--nodes", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, "SWEEP_NETNS": ""},
    )
    assert bad.returncode == 2 and "--nodes 2: no local nodes here" in bad.stderr


def _refuses_another_link(tmp_path: Path, profile: Path) -> None:
    """A profile measured across 'tbf 200Mbit' is refused by a sweep whose cluster.link names another
    link, and by local trials across a link now shaped otherwise; `sweep profile` refuses to measure
    a link other than the one the sweep file names."""
    from sweeper.errors import SpecError
    from sweeper.launchers.local import check_local_link
    from sweeper.spec.loader import parse_sweep

    with_profile = SWEEP.replace("gpu: cpu}", f"gpu: cpu, profile: {profile}, link: TBF 200mbit}}")
    parse_sweep(with_profile)  # case and spacing aside, the same link: no error
    other = with_profile.replace("link: TBF 200mbit", "link: tbf 1Gbit")
    with pytest.raises(
        SpecError,
        match=r"cluster.profile: .*p.yaml: link: measured across 'tbf 200Mbit'; this sweep's cluster.link is 'tbf 1Gbit'",
    ):
        parse_sweep(other)
    with netns.shaped_link("200mbit") as nodes:
        check_local_link(
            parse_sweep(with_profile.replace(", link: TBF 200mbit", "")), nodes
        )  # the link it was measured across: trials go on
        (tmp_path / "other.yaml").write_text(other.replace(f", profile: {profile}", ""))
        refused = subprocess.run(
            [sys.executable, "-m", "sweeper.cli", "profile", str(tmp_path / "other.yaml"), "--nodes", "2", "--quick"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "cluster.link 'tbf 1Gbit', but the local nodes' link" in refused.stderr.strip().splitlines()[-1]
    with (
        netns.shaped_link("1gbit") as nodes,
        pytest.raises(
            SweepError, match="measured across 'tbf 200Mbit', but the local nodes' link .* is 'tbf 1Gbit' now"
        ),
    ):
        check_local_link(parse_sweep(with_profile.replace(", link: TBF 200mbit", "")), nodes)


@pytest.mark.slow
def test_the_link_rate_changes_which_layout_is_faster(tmp_path: Path) -> None:
    """The two-node benchmark's grid tests the link: plain data parallelism over all four ranks (16 MB
    of gradients all-reduced across the link every step) loses to pp=2 x dp=2 (gradients reduced inside
    each node, only activations cross) on a 200 Mbit/s link, and the link is what decides it: the slower
    link adds more to dp4's step than to pp2 x dp2's, and dp4's step over pp2 x dp2's grows by more than a
    quarter. Alone on this machine it grew 3.2 times (0.87 at 10 Gbit/s, 2.83 at 200 Mbit/s); in a suite
    run beside other work it grew 1.4 times (0.87, 1.24; the link added 0.88 s to dp4's step, 0.55 s to
    pp2 x dp2's): a busy machine adds the same seconds to both layouts' steps, and DDP hides more of the
    all-reduce behind a backward pass that takes longer. On a quiet machine dp4 also wins at 10 Gbit/s
    (0.143 against 0.162 s; they cross between 2 and 5 Gbit/s), but beside the other xdist worker's load
    it did not (0.408 against 0.376 s in the suite): with more busy processes than cores, pp2's waiting
    stage gives its core to the others, so the crowd favours the pipeline whatever the link
    (sweeper.estimate.host.idle_costs prices the same thing)."""
    import importlib.util
    import statistics

    from sweeper.launchers.ranks import launch_trial
    from sweeper.layouts.layout import Layout
    from sweeper.spec.loader import parse_sweep

    spec = importlib.util.spec_from_file_location("pa", Path(__file__).parents[2] / "benchmarks/profile_accuracy.py")
    assert spec is not None and spec.loader is not None
    pa = importlib.util.module_from_spec(spec)
    sys.modules["pa"] = pa  # its dataclasses look their module up
    spec.loader.exec_module(pa)
    sweep = parse_sweep(pa.net_sweep_text("order").replace("steps: 12", "steps: 6"), profiles=False)
    dp4 = pa.layout_of(sweep, {"micro_batch_size": 2})
    pp2 = pa.layout_of(sweep, {"pp": 2, "micro_batch_size": 2})
    step: dict[tuple[str, str], float] = {}
    for rate in ("10gbit", "200mbit"):
        with netns.shaped_link(rate) as nodes:
            for name, layout in (("dp4", dp4), ("pp2_dp2", pp2)):
                assert isinstance(layout, Layout)
                got = launch_trial(sweep, layout, workdir=tmp_path / rate / name, timeout_s=300, nodes=nodes)
                assert got.status == "ok", got.error
                step[(rate, name)] = statistics.median(got.step_times_s)
    print(step)
    ratio = {rate: step[(rate, "dp4")] / step[(rate, "pp2_dp2")] for rate in ("10gbit", "200mbit")}
    assert step[("200mbit", "dp4")] > step[("200mbit", "pp2_dp2")], step
    slower = {name: step[("200mbit", name)] - step[("10gbit", name)] for name in ("dp4", "pp2_dp2")}
    assert slower["dp4"] > slower["pp2_dp2"], slower
    assert ratio["200mbit"] > 1.25 * ratio["10gbit"], ratio
