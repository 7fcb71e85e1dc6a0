"""Collectives against message size, and the tiny block split by tensor parallelism, on the ranks of
`sweep profile` (gloo on CPU, NCCL on GPUs; `sweeper.runtime.profile_run.profile_worker`).

Per collective and size: the slowest rank's mean time and nccl-tests' bus bandwidth. The scope is
`inter` when the ranks span more than one host, else `intra`.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sweeper.profiles.lookup import traffic
from sweeper.profiles.profile import BlockPoint, CollectivePoint
from sweeper.spec.models import ModelShape

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")


def _op(name: str, buf: torch.Tensor, world: int, rank: int) -> Callable[[], None]:
    """One call of collective `name` on a buffer of `buf`'s bytes (all-gather: its 1/n inputs;
    reduce-scatter: its 1/n outputs; send/recv: even ranks send to the next odd one)."""
    part = buf.chunk(world)[0].clone()
    out = torch.empty_like(buf)
    peer = rank + 1 if rank % 2 == 0 else rank - 1

    def call() -> None:
        if name == "all_reduce":
            dist.all_reduce(buf)
        elif name == "all_gather":
            dist.all_gather_into_tensor(buf, part)
        elif name == "reduce_scatter":
            dist.reduce_scatter_tensor(part, buf)
        elif name == "all_to_all":
            dist.all_to_all_single(out, buf)
        elif peer >= world:  # send/recv: an odd world's last rank sits it out
            return
        elif rank % 2 == 0:
            dist.send(buf, peer)
        else:
            dist.recv(buf, peer)

    return call


def _time(fn: Callable[[], None], device: torch.device, reps: int) -> float:
    fn()
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return (time.perf_counter() - start) / reps


def measure_collectives(
    sizes: list[int], device: torch.device, *, ops: tuple[str, ...] = OPS, budget_s: float = 0.05
) -> tuple[list[CollectivePoint], dict[str, str]]:
    """On every rank of the process group: each collective at each size (the slowest rank's time);
    returns the points and, per collective the backend lacks, why."""
    world, rank = dist.get_world_size(), dist.get_rank()
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    scope = "intra" if len(set(hosts)) == 1 else "inter"
    points, failed = [], {}
    for name in ops:
        for nbytes in sizes:
            numel = max(nbytes // 4 // world * world, world)
            buf = torch.ones(numel, device=device)
            try:
                fn = _op(name, buf, world, rank)
                once = _time(fn, device, 1)
                # the same count on every rank: the slowest rank's estimate decides
                est = torch.tensor([once], dtype=torch.float64, device=device)
                dist.all_reduce(est, op=dist.ReduceOp.MAX)
                reps = int(min(20, max(2, budget_s / max(float(est.item()), 1e-6))))
                seconds = torch.tensor([_time(fn, device, reps)], dtype=torch.float64, device=device)
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
            except (RuntimeError, ValueError) as e:  # a backend without this collective: every rank sees it
                failed[name] = " ".join(str(e).split())[:200]
                break
            s = float(seconds.item())
            moved = numel * 4
            busbw = float(traffic(name, np.array(float(world)))) * moved / s / 1e9
            points.append(CollectivePoint(op=name, scope=scope, ranks=world, bytes=moved, seconds=s, busbw_gbps=busbw))
    return points, failed


def tp_blocks(
    shape: ModelShape,
    settings: dict[str, str],
    *,
    rows: int,
    precision: str,
    device: torch.device,
    failed: dict[str, str],
) -> list[BlockPoint]:
    """The tiny block over a tensor-parallel mesh of every rank (the slowest rank's seconds): its
    host overhead under DTensor and its collectives at that size, as BlockPoint rows (knob tp or tp_sp)."""
    from torch.distributed.device_mesh import init_device_mesh

    from sweeper.runtime.profile_block import time_block
    from sweeper.runtime.profiling import Timer

    world = dist.get_world_size()
    if shape.heads % world or shape.kv_heads % world or rows % world:
        failed["tp block"] = f"{shape.heads} heads, {shape.kv_heads} kv heads, {rows} rows do not split over {world}"
        return []
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
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
