"""`sweep profile`: measure this node for the step-time model and write the profile file.

The compute (GEMMs, attention kernels, memory-bound work, launch overhead, the tiny block) is
measured in this process (`sweeper.trainer.profile_run`); the collectives on one process per
device of the node, started as a trial's ranks are (`sweeper.launchers.ranks.launch`). With a
sweep file the shapes are the sweep's (`sweeper.profile_plan`), else the default set.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.errors import SweepError
from sweeper.profile import BlockPoint, CollectivePoint, Profile, cached_profile_path, save_profile
from sweeper.profile_plan import (
    CPU_KERNELS,
    DEFAULT_CPU,
    DEFAULT_GPU,
    GPU_KERNELS,
    default_block_values,
    plan_for,
    sweep_block_values,
    sweep_workloads,
)

if TYPE_CHECKING:
    from sweeper.spec import Sweep

COMM_TIMEOUT_S = 600.0


@dataclass
class Measured:
    """A profile just measured, where it was written, and what was left out (with why)."""

    profile: Profile
    path: Path
    skipped: dict[str, str] = field(default_factory=dict)


def run_profile(
    sweep: Sweep | None,
    *,
    out: Path | None,
    quick: bool,
    progress: Callable[[str], None],
    want_cuda: bool = True,
) -> Measured:
    """Measure this node (the sweep's shapes, or the default set) and write the profile to `out`,
    or to the user's cache for this GPU."""
    import torch

    from sweeper.trainer.profile_run import local_device, measure_node

    device = local_device(want_cuda=want_cuda)
    cuda = device.type == "cuda"
    if sweep is not None:
        workloads, values = sweep_workloads(sweep), sweep_block_values(sweep)
        kernels = values["attention"]
        processes, precision, shapes_from = sweep.cluster.gpus_per_node, sweep.trial.precision, str(sweep.source)
    else:
        workloads = DEFAULT_GPU if cuda else DEFAULT_CPU
        values = default_block_values(cuda=cuda)
        kernels = GPU_KERNELS if cuda else CPU_KERNELS
        processes = torch.cuda.device_count() if cuda else 2
        precision, shapes_from = ("bf16" if cuda else "fp32"), "default"
    plan = plan_for(
        workloads,
        kernels=kernels,
        compile_=values["compile"] != ("false",),
        block_values=values,
        processes=processes,
        quick=quick,
    )
    profile, skipped = measure_node(
        plan,
        device=device,
        precision=precision,
        processes=processes,
        shapes_from=shapes_from,
        progress=progress,
        budget_s=0.01 if quick else 0.03,
    )
    if sweep is not None and sweep.cluster.gpu.name != profile.gpu:
        skipped["gpu"] = (
            f"this node's device is {profile.gpu} ({profile.device}), the sweep's cluster has {sweep.cluster.gpu.name}: "
            "the sweep will not read this profile"
        )
    if processes >= 2:
        progress(f"collectives on {processes} processes")
        block = {
            "shape": plan.block_shape,
            "rows": plan.block_seq,
            "settings": profile.block_base,
            "precision": precision,
        }
        points, blocks, failed = measure_collectives(plan.comm_bytes, processes=processes, block=block)
        profile = profile.model_copy(update={"collectives": tuple(points), "block": profile.block + tuple(blocks)})
        skipped |= {f"collective {k}": v for k, v in failed.items()}
    else:
        skipped["collectives"] = "one device on this node: no collective to measure"
    path = out if out is not None else cached_profile_path(profile.gpu)
    try:
        save_profile(profile, path)
    except OSError as e:
        raise SweepError(f"--out {path}: cannot write the profile: {e.strerror}") from None
    return Measured(profile, path, skipped)


def measure_collectives(
    sizes: tuple[int, ...], *, processes: int, block: dict[str, Any] | None = None
) -> tuple[list[CollectivePoint], list[BlockPoint], dict[str, str]]:
    """Each collective at each size on `processes` local ranks (gloo on CPU, NCCL on GPUs), and the
    tiny block split over them by tensor parallelism (`block`: see `profile_comm.comm_worker`)."""
    from sweeper.launchers.ranks import launch

    workdir = Path(tempfile.mkdtemp(prefix="sweep-profile-"))
    try:
        kwargs = {"sizes": list(sizes), "block": block}
        task = {"kind": "call", "target": "sweeper.trainer.profile_comm:comm_worker", "kwargs": kwargs}
        done = launch(task, nprocs=processes, timeout_s=COMM_TIMEOUT_S, workdir=workdir)
        path = done.out_dir / "comm.json"
        if not path.exists():
            return [], [], {"all": f"no result from the ranks: {done.log_tail(0, 3).strip()[-300:]}"}
        data = json.loads(path.read_text())
        points = [CollectivePoint.model_validate(p) for p in data["points"]]
        return points, [BlockPoint.model_validate(b) for b in data["blocks"]], dict(data["failed"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
