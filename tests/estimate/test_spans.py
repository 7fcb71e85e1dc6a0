"""Every collective priced by the nodes it spans (sweeper.estimate.spans): the node's table within a
node, the two-node measurement (by ranks of each node) across the link, the alpha-beta ring fitted on
it beyond two nodes, nothing (NaN: the table's price) where nothing was measured."""

from __future__ import annotations

import numpy as np
import pytest

from sweeper.estimate.spans import collective_by_span, fit_alpha_beta, path, span, steps
from sweeper.profiles.lookup import Lookup
from sweeper.profiles.profile import CollectivePoint, traffic
from tests.profiles.test_profile import synthetic_profile

ALPHA, LINK = 50e-6, 100e6  # a link's per-step latency and bytes per second, per node's share


def across(op: str, q: int, nbytes: int) -> CollectivePoint:
    """A gloo ring over 2q ranks across two nodes: each step alpha, the ring edge's bytes over the
    link (shared by nothing else: one edge each way crosses it)."""
    n = 2 * q
    s = float(ALPHA * steps(op, np.array(float(n))) + path(op, np.array(float(n))) * nbytes / LINK)
    bus = float(traffic(op, np.array(float(n)))) * nbytes / s / 1e9
    return CollectivePoint(op=op, scope="inter", ranks=n, per_node=q, algorithm="gloo ring", bytes=nbytes,
                           seconds=s, busbw_gbps=bus)  # fmt: skip


def lookup_with(inter: bool = True) -> Lookup:
    p = synthetic_profile()
    points = [across(op, q, b) for op in ("all_reduce", "send_recv") for q in (1, 2) for b in (4096, 1 << 20, 1 << 24)]
    # two nodes of two ranks: the points of q = 1 had two groups sharing each link, those of q = 2 one
    extra = tuple(points) if inter else ()
    return Lookup(p.model_copy(update={"collectives": p.collectives + extra, "nodes": 2, "processes": 4}))


def test_span_counts_nodes_and_members_per_node() -> None:
    nodes, per = span(np.array([2.0, 4.0, 2.0, 8.0]), np.array([1.0, 1.0, 2.0, 2.0]), 2)
    assert nodes.tolist() == [1.0, 2.0, 2.0, 8.0]
    assert per.tolist() == [2.0, 2.0, 1.0, 1.0]


def test_each_span_reads_its_own_measurement() -> None:
    lookup = lookup_with()
    nbytes = np.full(3, float(1 << 24))
    got = collective_by_span(lookup, "all_reduce", np.array([2.0, 4.0, 2.0]), np.array([1.0, 1.0, 2.0]), nbytes, 2)
    inside = lookup.collective_s("all_reduce", "intra", np.array([2.0]), nbytes[:1])[0]
    assert got[0] == pytest.approx(inside)  # within node 0: the node's table (1 GB/s)
    want_4 = ALPHA * 6 + 1.5 * (1 << 24) / LINK  # 2 of each node: the ring of 4 measured
    want_2 = ALPHA * 2 + 1.0 * (1 << 24) / LINK  # 1 of each node: the ring of 2 measured
    assert got[1] == pytest.approx(want_4, rel=1e-6)
    assert got[2] == pytest.approx(want_2, rel=1e-6)
    assert got[1] > 5 * inside  # the link, not the node's table


def test_nodes_of_fewer_ranks_than_the_profiles_share_the_link_among_fewer_groups() -> None:
    # the profile's q = 1 points: two groups (one per rank of a 2-rank node) crossed each link at once;
    # on nodes of one rank the group has the link to itself (four nodes of one GPU each, or one
    # group of a kind per node): the link's time halves, never below the smallest message's
    lookup = lookup_with()
    big, small = np.array([float(1 << 24)]), np.array([4096.0])
    # strided, as data parallelism over tensor parallelism: one rank of each node, two such groups a link
    shared = collective_by_span(lookup, "all_reduce", np.array([2.0]), np.array([2.0]), big, 2)
    assert shared[0] == pytest.approx(ALPHA * 2 + (1 << 24) / LINK, rel=1e-6)
    alone = collective_by_span(lookup, "all_reduce", np.array([2.0]), np.array([1.0]), big, 1)
    assert alone[0] == pytest.approx(shared[0] / 2, rel=1e-6)
    floor = ALPHA * 2 + 4096 / LINK  # the smallest message measured
    assert collective_by_span(lookup, "all_reduce", np.array([2.0]), np.array([1.0]), small, 1)[0] == pytest.approx(
        floor, rel=1e-6
    )
    # nodes of the profile's own shape: as measured (q = 2 is one group per link on either)
    assert collective_by_span(lookup, "all_reduce", np.array([4.0]), np.array([1.0]), big, 2)[0] == pytest.approx(
        ALPHA * 6 + 1.5 * (1 << 24) / LINK, rel=1e-6
    )


def test_beyond_two_nodes_the_fitted_ring() -> None:
    lookup = lookup_with()
    fit = fit_alpha_beta(lookup, "all_reduce")
    assert fit is not None
    assert fit.alpha == pytest.approx(ALPHA, rel=1e-3) and fit.beta == pytest.approx(1 / LINK, rel=1e-3)
    ranks, nbytes = np.array([16.0]), np.array([float(1 << 22)])
    got = collective_by_span(lookup, "all_reduce", ranks, np.array([1.0]), nbytes, 2)  # 8 nodes
    assert got[0] == pytest.approx(ALPHA * 30 + 2 * 15 / 16 * (1 << 22) / LINK, rel=1e-3)


def test_nothing_measured_across_is_nan_for_the_table() -> None:
    lookup = lookup_with(inter=False)
    got = collective_by_span(lookup, "all_reduce", np.array([4.0, 2.0]), np.array([1.0, 1.0]), np.full(2, 1e6), 2)
    assert np.isnan(got[0]) and not np.isnan(got[1])
    assert fit_alpha_beta(lookup, "all_reduce") is None


def test_a_broadcast_beyond_two_nodes_is_the_fitted_binomial_tree() -> None:
    """gloo's broadcast: ceil(log2 n) rounds, each sending the whole buffer (not a ring's share)."""
    p = synthetic_profile()
    points = tuple(across("broadcast", q, b) for q in (1, 2) for b in (4096, 1 << 20, 1 << 24))
    lookup = Lookup(p.model_copy(update={"collectives": p.collectives + points, "nodes": 2}))
    fit = fit_alpha_beta(lookup, "broadcast")
    assert fit is not None
    assert fit.alpha == pytest.approx(ALPHA, rel=1e-3) and fit.beta == pytest.approx(1 / LINK, rel=1e-3)
    got = collective_by_span(lookup, "broadcast", np.array([16.0, 12.0]), np.ones(2), np.full(2, float(1 << 22)), 2)
    assert got == pytest.approx([4 * (ALPHA + (1 << 22) / LINK)] * 2, rel=1e-3)  # 8 and 6 nodes: 4 rounds
