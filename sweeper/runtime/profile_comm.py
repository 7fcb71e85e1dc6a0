"""Collectives against message size, and the tiny block split by tensor parallelism, on the ranks of
`sweep profile` (gloo on CPU, NCCL on GPUs; `sweeper.runtime.profile_run.profile_worker`).

Per collective and size: the slowest rank's mean time and nccl-tests' bus bandwidth. The scope is
`inter` when the ranks span more than one host, else `intra`; a job of several nodes measures within
node 0 and across the nodes apart, with 1..n of each node's ranks (`across_nodes`).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sweeper.profiles.profile import BlockPoint, CollectivePoint, traffic
from sweeper.spec.models import ModelShape

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all", "broadcast")


def _op(name: str, buf: torch.Tensor, group: Any) -> Callable[[], None]:
    """One call of collective `name` over `group` on a buffer of `buf`'s bytes (all-gather: its 1/n
    inputs; reduce-scatter: its 1/n outputs; broadcast: from the group's first member, as ZeRO-1's
    optimizer sends each updated parameter from the rank that owns it; send/recv: the group's first
    half sends to its second, member i to member i + n/2, so that across two nodes every pair crosses
    the link)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    part = buf.chunk(world)[0].clone()
    out = torch.empty_like(buf)
    half = world // 2
    peer = rank + half if rank < half else rank - half
    members = dist.get_process_group_ranks(group) if group is not None else list(range(world))

    def call() -> None:
        if name == "all_reduce":
            dist.all_reduce(buf, group=group)
        elif name == "all_gather":
            dist.all_gather_into_tensor(buf, part, group=group)
        elif name == "reduce_scatter":
            dist.reduce_scatter_tensor(part, buf, group=group)
        elif name == "all_to_all":
            dist.all_to_all_single(out, buf, group=group)
        elif name == "broadcast":
            dist.broadcast(buf, members[0], group=group)
        elif peer >= world or half == 0:  # send/recv: an odd group's last member sits it out
            return
        elif rank < half:
            dist.send(buf, members[peer], group=group)
        else:
            dist.recv(buf, members[peer], group=group)

    return call


def _time(fn: Callable[[], None], device: torch.device, reps: int, group: Any) -> float:
    fn()
    dist.barrier(group=group)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / reps


def algorithm(device: torch.device, op: str) -> str:
    """How the backend runs `op` across ranks (what the model prices it as): gloo's collectives are
    flat rings over the ranks in group order (all-to-all: pairwise exchanges, send/recv: one stream,
    broadcast: a binomial tree, whose last round sends half the group's copies at once); NCCL picks
    ring or tree per size itself."""
    if device.type == "cuda":
        return "nccl (ring or tree, its choice)"
    return {"all_to_all": "gloo pairwise", "send_recv": "gloo pair", "broadcast": "gloo binomial tree"}.get(
        op, "gloo ring"
    )


def measure_collectives(
    sizes: list[int],
    device: torch.device,
    *,
    ops: tuple[str, ...] = OPS,
    budget_s: float = 0.05,
    group: Any = None,
    scope: str | None = None,
    per_node: int | None = None,
    together: bool = False,
) -> tuple[list[CollectivePoint], dict[str, str]]:
    """On every member of `group` (default: all ranks): each collective at each size (the slowest
    member's time); returns the points and, per collective the backend lacks, why. `scope` None: inter
    when the members span more than one host, else intra. `together`: every rank of the world runs
    this at once in its own group; they start each timing together and keep the slowest group's."""
    agree = None if together else group
    world = dist.get_world_size(group)
    if scope is None:
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname(), group=group)
        scope = "intra" if len(set(hosts)) == 1 else "inter"
    points, failed = [], {}
    for name in ops:
        for nbytes in sizes:
            numel = max(nbytes // 4 // world * world, world)
            buf = torch.ones(numel, device=device)
            try:
                fn = _op(name, buf, group)
                once = _time(fn, device, 1, agree)
                # the same count on every rank: the slowest rank's estimate decides
                est = torch.tensor([once], dtype=torch.float64, device=device)
                dist.all_reduce(est, op=dist.ReduceOp.MAX, group=agree)
                reps = int(min(20, max(2, budget_s / max(float(est.item()), 1e-6))))
                seconds = torch.tensor([_time(fn, device, reps, agree)], dtype=torch.float64, device=device)
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX, group=agree)
            except (RuntimeError, ValueError) as e:  # a backend without this collective: every rank sees it
                failed[name] = " ".join(str(e).split())[:200]
                break
            s = float(seconds.item())
            moved = numel * 4
            busbw = float(traffic(name, np.array(float(world)))) * moved / s / 1e9
            points.append(
                CollectivePoint(
                    op=name,
                    scope=scope,
                    ranks=world,
                    per_node=per_node,
                    algorithm=algorithm(device, name) if scope == "inter" else None,
                    bytes=moved,
                    seconds=s,
                    busbw_gbps=busbw,
                )
            )
    return points, failed


def across_nodes(
    sizes: list[int], device: torch.device, *, nodes: int, per_node: int, progress: Callable[[str], None]
) -> tuple[list[CollectivePoint], dict[str, str]]:
    """The collectives within each node (every node at once, each over its own ranks), then across
    the nodes in groups of q of each node's ranks, for each q dividing the node's ranks, with every
    rank of every node taking part (per_node / q groups at once, strided as data parallelism's groups
    are across tensor-parallel ranks): the node's link is shared as a trial shares it. A point's
    `per_node` is q. Every rank calls this (process groups are made by all)."""
    rank = dist.get_rank()
    node = rank // per_node
    points: list[CollectivePoint] = []
    failed: dict[str, str] = {}
    if per_node >= 2:
        progress(f"collectives within each node ({per_node} ranks)")
        groups = [dist.new_group([k * per_node + i for i in range(per_node)]) for k in range(nodes)]
        got, failed = measure_collectives(sizes, device, group=groups[node], scope="intra", together=True)
        points += got if node == 0 else []
    for q in [q for q in range(1, per_node + 1) if per_node % q == 0]:
        stride = per_node // q
        progress(f"collectives across {nodes} nodes, groups of {q} rank{'s' if q > 1 else ''} of each")
        members = [[k * per_node + j + stride * i for k in range(nodes) for i in range(q)] for j in range(stride)]
        groups = [dist.new_group(m) for m in members]
        mine = next(g for g, m in zip(groups, members, strict=True) if rank in m)
        got, why = measure_collectives(sizes, device, group=mine, scope="inter", per_node=q, together=True)
        points += got if rank in members[0] else []
        failed |= {f"{k} (across nodes)": v for k, v in why.items()}
    return points, failed


def tp_blocks(
    shape: ModelShape,
    settings: dict[str, str],
    *,
    rows: int,
    precision: str,
    device: torch.device,
    failed: dict[str, str],
    nodes: int = 1,
) -> list[BlockPoint]:
    """The tiny block over a tensor-parallel mesh of each node's ranks, every node at once (the slowest
    rank's seconds): its host overhead under DTensor and its collectives at that size, as BlockPoint
    rows (knob tp or tp_sp)."""
    from torch.distributed.device_mesh import init_device_mesh

    from sweeper.runtime.profile_block import time_block
    from sweeper.runtime.profiling import Timer

    world = dist.get_world_size() // nodes
    if world < 2:
        return []
    if shape.heads % world or shape.kv_heads % world or rows % world:
        failed["tp block"] = f"{shape.heads} heads, {shape.kv_heads} kv heads, {rows} rows do not split over {world}"
        return []
    mesh = init_device_mesh(device.type, (nodes, world), mesh_dim_names=("node", "tp"))
    out = []
    for knob, sp in (("tp", False), ("tp_sp", True)):
        try:
            mine = time_block(
                shape,
                settings,
                rows=rows,
                precision=precision,
                timer=Timer(device, budget_s=0.05, together=True),
                tp_mesh=mesh["tp"],
                sequence_parallel=sp,
            )
        except Exception as e:  # noqa: BLE001 - every rank fails alike (same model, same plan); say why
            failed[f"tp block ({knob})"] = " ".join(str(e).split())[:200]
            continue
        slowest = torch.tensor([mine], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out.append(BlockPoint(knob=knob, value=str(world), rows=rows, seconds=float(slowest.item())))
    return out
