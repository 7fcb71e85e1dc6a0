"""A trial across nodes is as correct as one within: the layouts of four ranks trained on the two-node
cluster of network namespaces (scripts/netns/start.sh, a shaped veth between them), two ranks per node,
reproduce the single-process reference under the same bounds as test_parity.py (4 x the noise floor
of float32 rounding, tests/runtime/bounds.py). Ranks are ordered tp inside dp inside pp: tp stays in
a node, dp (DDP-style replication, ZeRO-1, FSDP) and pp cross the link."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sweeper.launchers import netns

from .helpers import STEPS, run_workers
from .test_parity import FOUR_RANKS, _check, specs

ACROSS = {
    cid: FOUR_RANKS[cid]
    for cid in ("dp2_tp2_replicate", "dp2_tp2_zero1", "dp2_tp2_sp_fsdp", "pp2_tp2_sp", "dp2_pp2_fsdp")
}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and tc need root"),
]


@pytest.fixture(scope="module")
def across_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One launch of 2 nodes x 2 ranks over a 1 Gbit/s link, every case one after another."""
    with netns.shaped_link("1gbit") as nodes:
        done = run_workers(
            "parity",
            nprocs=2,
            nodes=nodes,
            workdir=tmp_path_factory.mktemp("parity_nodes"),
            timeout_s=400,
            env={},  # the CPU's own kernels: what is tested here is the link
            cases=specs(ACROSS, 4),
            steps=STEPS,
        )
        yield done.out_dir


@pytest.mark.parametrize("case_id", list(ACROSS))
def test_two_nodes_match_single_process(across_nodes: Path, case_id: str) -> None:
    knobs: Any = ACROSS[case_id]
    _check(across_nodes, case_id, *knobs)
