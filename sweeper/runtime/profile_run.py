"""`sweep profile`'s measurements, on one process per device started as a trial's ranks are
(`sweeper.run.profiler`): every rank measures the plan's shapes on its own device at once (on a CPU
the ranks share the cores, as a trial's do), then the collectives and the tensor-parallel block
run over all of them (`sweeper.runtime.profile_comm`); rank 0 writes the profile."""

from __future__ import annotations

import datetime
import json
import platform
import socket
import sys
from pathlib import Path
from typing import Any

import torch

from sweeper.estimate.shapes import PROGRESS_MARK, MeasurePlan
from sweeper.process import node_cpus
from sweeper.profiles.profile import SCHEMA, BlockPoint, Profile, Versions
from sweeper.runtime.env import (
    DistEnv,
    init_distributed,
    local_world_size,
    pick_device,
    prepare_process_environment,
    runtime_versions,
)
from sweeper.runtime.profile_block import measure_blocks, measure_wrapped
from sweeper.runtime.profile_comm import across_nodes, measure_collectives, tp_blocks
from sweeper.runtime.profiling import (
    Progress,
    Timer,
    fp8_supported,
    measure_attention,
    measure_compiled,
    measure_elementwise,
    measure_fp8_cast,
    measure_gemm,
    measure_gemm_fp8,
    measure_launch,
    modes_for,
)
from sweeper.spec.hardware import GPUS, gpu_matches


def gpu_key(device: torch.device) -> tuple[str, str]:
    """(the GPU table's key, the device's own name); a card the table lacks keeps its own name, lowered."""
    if device.type != "cuda":
        return "cpu", f"CPU ({platform.processor() or platform.machine()}, {node_cpus()} cores)"
    name = torch.cuda.get_device_name(device)
    key = next((g.name for g in GPUS.values() if g.name != "cpu" and gpu_matches(g, name)), None)
    return key or name.lower().replace(" ", "-"), name


def release(device: torch.device) -> None:
    """Give back what the measurements held (compiled graphs, cached blocks): trials run next, on this GPU."""
    import gc

    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def driver_version() -> str | None:
    """The NVIDIA driver's version (from /proc, no tool needed), or None."""
    try:
        text = open("/proc/driver/nvidia/version").read()  # noqa: SIM115 - a one-line read
    except OSError:
        return None
    words = text.split()
    return next((w for w in words if w.count(".") >= 1 and w.replace(".", "").isdigit()), None)


def measure_node(
    plan: MeasurePlan,
    *,
    device: torch.device,
    precision: str,
    processes: int,
    shapes_from: str,
    progress: Progress,
    budget_s: float = 0.02,
) -> tuple[Profile, dict[str, str]]:
    """Every measurement of the plan but the collectives; returns the profile and what was left out, with why."""
    cpus = node_cpus()  # the cores the node's ranks may use (taskset -c 0: one), not this bound rank's one
    threads = max(1, cpus // processes)
    if device.type == "cpu":
        torch.set_num_threads(threads)  # what a trial rank gets (sweeper.launchers.ranks)
    dtype = "bf16" if device.type == "cuda" and precision == "bf16" else "fp32"
    if precision == "fp32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # as the trainer runs fp32 (env.set_matmul_precision)
    timer = Timer(device, budget_s=budget_s)
    skipped: dict[str, str] = {}
    progress("launch overhead")
    launch_s = measure_launch(device)
    shapes = sorted(plan.gemm)
    gemm = measure_gemm(shapes, dtype=dtype, timer=timer, progress=progress)
    if fp8_supported(device):
        try:
            gemm += measure_gemm_fp8(shapes, timer=timer, progress=progress)
        except Exception as e:  # noqa: BLE001 - a torch without this fp8 GEMM: bf16 only, say why
            skipped["fp8 GEMM"] = " ".join(str(e).split())[:200]
    attention, why = measure_attention(
        sorted(plan.attention), kernel_names=plan.kernels, dtype=dtype, timer=timer, progress=progress
    )
    skipped |= why
    cases = sorted(plan.elementwise)
    elementwise = measure_elementwise(cases, modes=modes_for(plan), dtype=dtype, timer=timer, progress=progress)
    if plan.compile:
        compiled, failed = measure_compiled(cases, dtype=dtype, timer=timer, progress=progress)
        elementwise += compiled
        if failed:
            skipped["compiled memory-bound work"] = failed
    if fp8_supported(device):
        elementwise += measure_fp8_cast(cases, timer=timer)
    blocks: list[Any] = []
    if plan.block_shape is not None:
        blocks, why = measure_blocks(
            plan.block_shape,
            plan.block_values,
            rows=plan.block_seq,
            precision=precision,
            timer=timer,
            progress=progress,
        )
        skipped |= {f"block {k}": v for k, v in why.items()}
    release(device)
    key, name = gpu_key(device)
    versions = runtime_versions(device)
    profile = Profile(
        schema=SCHEMA,
        gpu=key,
        device=name,
        host=socket.gethostname(),
        measured_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        versions=Versions(
            python=platform.python_version(),
            torch=versions["torch_version"],
            cuda=versions["cuda_version"],
            nccl=versions["nccl_version"],
            driver=driver_version() if device.type == "cuda" else None,
            backend="nccl" if device.type == "cuda" else "gloo",
        ),
        shapes_from=shapes_from,
        processes=processes,
        cpus=cpus,
        threads=threads if device.type == "cpu" else 1,
        launch_s=launch_s,
        block_base=plan.block_base,
        gemm=tuple(gemm),
        attention=tuple(attention),
        elementwise=tuple(elementwise),
        block=tuple(blocks),
    )
    return profile, skipped


PROFILE_FILE = "profile.json"


def wrapped_blocks(
    plan: MeasurePlan, precision: str, device: torch.device, skipped: dict[str, str]
) -> list[BlockPoint]:
    """The tiny model under each data-parallel wrapper, every rank at once (as a trial's ranks share
    the cores), each on a mesh of itself. Only on CPU ranks: on a GPU the hooks' host time runs while
    the kernels do (`sweeper.estimate.profiled` prices them on CPU ranks only)."""
    from torch.distributed.device_mesh import init_device_mesh

    assert plan.block_shape is not None
    world = torch.distributed.get_world_size()
    alone = init_device_mesh(device.type, (world, 1), mesh_dim_names=("rank", "dp"))["dp"]
    timer = Timer(device, budget_s=0.15, together=True)  # every rank at once: the cores shared as in a trial
    return measure_wrapped(
        plan.block_shape,
        plan.block_base,
        rows=plan.block_seq,
        precision=precision,
        timer=timer,
        mesh=alone,
        failed=skipped,
        rounds=plan.wrapper_rounds,
    )


def profile_worker(
    *,
    out_dir: Path,
    plan: MeasurePlan,
    precision: str,
    shapes_from: str,
    budget_s: float,
    want_cuda: bool = True,
    link: str | None = None,
) -> None:
    """On every rank: the plan's measurements on this rank's device, then (two ranks or more) the
    collectives and the tensor-parallel block over all of them (a job of several nodes: within node 0,
    then across the nodes; `link` is how the caller describes the link between them). Rank 0 prints its progress (its log
    is followed by `sweep profile`) and writes `profile.json`: the profile and what was left out."""
    prepare_process_environment()
    env = DistEnv.from_environ()
    device = pick_device(env, want_cuda=want_cuda)
    init_distributed(env, device, timeout_s=600)
    rank, world = env.rank, env.world_size

    def progress(what: str) -> None:
        if rank == 0:
            print(PROGRESS_MARK + what, flush=True)

    per_node = local_world_size(env)
    nodes = max(1, world // per_node)
    hosts: list[Any] = [None] * world
    torch.distributed.all_gather_object(hosts, socket.gethostname())
    shared = nodes > 1 and len(set(hosts)) == 1  # namespaces of one machine (sweeper.launchers.netns)
    profile, skipped = measure_node(
        plan,
        device=device,
        precision=precision,
        processes=world if nodes == 1 or shared else per_node,  # what shares this rank's cores
        shapes_from=shapes_from,
        progress=progress,
        budget_s=budget_s,
    )
    torch.distributed.barrier()
    if nodes > 1:
        points, failed = across_nodes(list(plan.comm_bytes), device, nodes=nodes, per_node=per_node, progress=progress)
        profile = profile.model_copy(update={"nodes": nodes, "shared_host": shared, "link": link})
    elif world >= 2:
        progress(f"collectives on {world} processes")
        points, failed = measure_collectives(list(plan.comm_bytes), device)
    if world >= 2:
        blocks = []
        if plan.block_shape is not None:
            blocks = tp_blocks(
                plan.block_shape,
                plan.block_base,
                rows=plan.block_seq,
                precision=precision,
                device=device,
                failed=failed,
                nodes=nodes,
            )
        profile = profile.model_copy(update={"collectives": tuple(points), "block": profile.block + tuple(blocks)})
        skipped |= {f"collective {k}": v for k, v in failed.items()}
    else:
        skipped["collectives"] = "one device on this node: no collective to measure"
    if plan.block_shape is not None and device.type == "cpu":
        progress("data-parallel wrappers (replicate, FSDP) on the tiny model")
        profile = profile.model_copy(
            update={"block": profile.block + tuple(wrapped_blocks(plan, precision, device, skipped))}
        )
    if rank == 0:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / PROFILE_FILE).write_text(json.dumps({"profile": profile.to_dict(), "skipped": skipped}))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
