"""Collectives against message size on real processes (gloo on CPU, NCCL on GPUs), started the way a
trial's ranks are (`sweeper.launchers.ranks.launch`, one process per device).

Every rank runs `comm_worker`; rank 0 writes `comm.json`: per collective and size the slowest
rank's mean time and nccl-tests' bus bandwidth. The scope is `inter` when the ranks span more
than one host (run under `srun -N2 ...` with the ranks' variables set by SLURM), else `intra`.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sweeper.profile_lookup import traffic
from sweeper.trainer.env import DistEnv, init_distributed, pick_device

OPS = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")
COMM_FILE = "comm.json"


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


def comm_worker(
    *,
    out_dir: Path,
    sizes: list[int],
    ops: list[str] | None = None,
    budget_s: float = 0.05,
    block: dict[str, Any] | None = None,
) -> None:
    """On every rank: each collective at each size, then (`block`: shape, settings, rows, precision)
    the tiny block split over all ranks by tensor parallelism, without and with sequence parallelism.
    Rank 0 writes the points (and what failed, with why)."""
    env = DistEnv.from_environ()
    device = pick_device(env)
    init_distributed(env, device, timeout_s=300)
    world, rank = env.world_size, env.rank
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    scope = "intra" if len(set(hosts)) == 1 else "inter"
    points, failed = [], {}
    for name in ops or OPS:
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
            busbw = float(traffic(name, torch.tensor(float(world)).numpy())) * moved / s / 1e9
            points.append(
                {"op": name, "scope": scope, "ranks": world, "bytes": moved, "seconds": s, "busbw_gbps": busbw}
            )
    blocks = tp_blocks(block, device, failed) if block is not None and scope == "intra" else []
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        text = json.dumps(
            {"points": points, "blocks": blocks, "failed": failed, "backend": dist.get_backend(), "hosts": hosts}
        )
        (out_dir / COMM_FILE).write_text(text)
    dist.barrier()
    dist.destroy_process_group()


def tp_blocks(block: dict[str, Any], device: torch.device, failed: dict[str, str]) -> list[dict[str, Any]]:
    """The tiny block over a tensor-parallel mesh of every rank (the slowest rank's seconds): its
    host overhead under DTensor and its collectives at that size, as BlockPoint rows (knob tp or tp_sp)."""
    from torch.distributed.device_mesh import init_device_mesh

    from sweeper.trainer.profile_block import time_block
    from sweeper.trainer.profiling import Timer

    world = dist.get_world_size()
    shape, rows = block["shape"], block["rows"]
    if shape.heads % world or shape.kv_heads % world or rows % world:
        failed["tp block"] = f"{shape.heads} heads, {shape.kv_heads} kv heads, {rows} rows do not split over {world}"
        return []
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("tp",))
    out = []
    for knob, sp in (("tp", False), ("tp_sp", True)):
        try:
            mine = time_block(
                shape,
                block["settings"],
                rows=rows,
                precision=block["precision"],
                timer=Timer(device, budget_s=0.05),
                tp_mesh=mesh["tp"],
                sequence_parallel=sp,
            )
        except Exception as e:  # noqa: BLE001 - every rank fails alike (same model, same plan); say why
            failed[f"tp block ({knob})"] = " ".join(str(e).split())[:200]
            continue
        slowest = torch.tensor([mine], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        out.append({"knob": knob, "value": str(world), "rows": rows, "seconds": float(slowest.item())})
    return out
