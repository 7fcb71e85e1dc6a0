"""The two-node cluster on one machine (scripts/netns/start.sh): the link is shaped as asked, the
loopback inside a node is not, a trial's ranks run across it, and stop leaves nothing behind."""

from __future__ import annotations

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


def test_ranks_of_each_node_run_in_its_namespace(tmp_path: Path) -> None:
    """Two ranks per node: each reports the namespace it runs in and its peers' (all-gather over gloo
    across the link), so node k's ranks are in sweep-node<k> and meet at node 0's address."""
    with netns.shaped_link("1gbit") as nodes:
        task = {"kind": "call", "target": "tests.ranks_targets:report_netns", "kwargs": {}}
        done = launch(task, nprocs=2, timeout_s=120, workdir=tmp_path, nodes=nodes)
    assert done.returncodes == [0, 0, 0, 0], [done.log_tail(r) for r in range(4)]
    got = (done.out_dir / "netns.txt").read_text().split()
    assert got == ["sweep-node0", "sweep-node0", "sweep-node1", "sweep-node1"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
