"""Where a trial runs: its rank and world from torchrun or SLURM/submitit variables, its device, its mesh.

The process group is created on a rendezvous store that this module keeps, so the ranks can
also use the store to agree on a trial's outcome without any collective (see `outcome.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from sweeper.errors import one_line
from sweeper.process import free_port


@dataclass(frozen=True)
class DistEnv:
    """Rank, world and rendezvous address of this process."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    agent_store: bool = False  # torchrun's agent already serves the store on master_port

    @classmethod
    def from_environ(cls) -> DistEnv:
        """torchrun-style variables; else a submitit (SLURM or local) job; else a single process."""
        env = os.environ
        if "RANK" not in env and env.get("SUBMITIT_EXECUTOR"):
            from submitit.helpers import TorchDistributedEnvironment

            TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        if "RANK" in env and "WORLD_SIZE" in env:
            return cls(
                int(env["RANK"]),
                int(env["WORLD_SIZE"]),
                int(env.get("LOCAL_RANK", env["RANK"])),
                env.get("MASTER_ADDR", "127.0.0.1"),
                int(env.get("MASTER_PORT", "29500")),
                env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            )
        return cls(0, 1, 0, "127.0.0.1", free_port())


def device_index(local_rank: int, local_world_size: int, visible: int, node_gpus: int | None = None) -> int:
    """Which of the `visible` CUDA devices this rank drives.

    Without binding every task sees all the node's GPUs and takes the one of its local rank.
    With `--gpus-per-task=1` or `--gpu-bind` each task sees only its own (one, or its socket's
    share), so fewer devices than local ranks is normal there: the rank takes `local_rank mod
    visible`. What is refused is two ranks on one GPU: a node with fewer GPUs than ranks
    (`node_gpus`, SLURM's SLURM_GPUS_ON_NODE where known, else what this task sees), or
    shares that do not divide the ranks evenly.
    """
    if visible < 1:
        raise RuntimeError("no CUDA device is visible to this task (CUDA_VISIBLE_DEVICES is empty?)")
    if visible >= local_world_size:
        return local_rank
    node = node_gpus if node_gpus is not None else visible
    if node < local_world_size:
        raise RuntimeError(f"{local_world_size} ranks on this node but only {node} GPUs: one GPU per rank is needed")
    if local_world_size % visible:
        raise RuntimeError(
            f"each task sees {visible} GPUs and {local_world_size} ranks share this node: "
            "a binding that does not divide the ranks evenly would put two ranks on one GPU"
        )
    return local_rank % visible


def local_world_size(env: DistEnv) -> int:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE, else SLURM's tasks on this node."""
    raw = os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE") or "1"
    try:
        return int(raw.split("(")[0].split(",")[0])  # SLURM may write "8(x2)"
    except ValueError:
        return 1


def node_gpus() -> int | None:
    """GPUs allocated to this job on this node, as SLURM states it (None outside SLURM)."""
    raw = os.environ.get("SLURM_GPUS_ON_NODE")
    return int(raw) if raw and raw.isdigit() else None


def cuda_unusable_reason() -> str | None:
    """Why CUDA cannot run here (a CPU build of torch, no driver, no device), or None when it can."""
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"this torch ({torch.__version__}) is a CPU-only build: install a CUDA build of torch"
    if torch.cuda.is_available():
        return None
    try:
        torch.cuda.init()  # raises with the driver's own message
    except Exception as e:  # noqa: BLE001 - any reason is the answer
        return f"CUDA cannot initialise: {one_line(e)}"
    return "torch.cuda.is_available() is False (no visible GPU, or the driver is missing)"


def pick_device(env: DistEnv, *, want_cuda: bool = True) -> torch.device:
    """This rank's GPU when CUDA is usable (see `device_index`), else the CPU."""
    if want_cuda and torch.cuda.is_available():
        index = device_index(env.local_rank, local_world_size(env), torch.cuda.device_count(), node_gpus())
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def prepare_process_environment(environ: dict[str, str] | None = None) -> None:
    """What torchtitan's launcher sets, before CUDA initialises in this process.

    expandable_segments: the caching allocator grows segments instead of fragmenting into
    fixed blocks, which otherwise turns varying activation sizes into spurious OOMs.
    """
    env = os.environ if environ is None else environ
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")


def set_matmul_precision(precision: str) -> None:
    """fp32 runs use TF32 tensor cores (MFU divides by the card's TF32 peak); bf16 runs are unaffected."""
    if precision == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def runtime_versions(device: torch.device) -> dict[str, Any]:
    """torch, CUDA and NCCL versions and the GPU's name, for the result row."""
    nccl = None
    if device.type == "cuda":
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception:  # noqa: BLE001 - a build without NCCL: nothing to record
            nccl = None
    return {
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "nccl_version": nccl,
        "gpu_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
    }


def connect_store(env: DistEnv, *, timeout_s: float, server: bool) -> dist.Store:
    """A client (or, on rank 0, the server) of the rendezvous store."""
    return dist.TCPStore(
        env.master_addr,
        env.master_port,
        env.world_size if server else None,
        is_master=server,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def init_distributed(env: DistEnv, device: torch.device, *, timeout_s: float) -> dist.Store:
    """Start the process group (NCCL on GPUs, gloo on CPU); returns the store it was built on."""
    store = connect_store(env, timeout_s=timeout_s, server=env.rank == 0 and not env.agent_store)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        store=dist.PrefixStore("pg", store),
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return store


def build_mesh(device: torch.device, *, pp: int, dp: int, tp: int, cp: int = 1) -> DeviceMesh:
    """pp x dp x cp x tp with tp innermost: tensor-parallel peers are neighbouring ranks (one
    node), context-parallel peers next (they exchange keys and values in every layer), as
    Megatron-LM and torchtitan order them.

    Where cp > 1 dp and cp are also flattened into "dp_cp" (`data_mesh`): the ranks that hold
    different tokens of the same weights, over which dense gradients are averaged.
    """
    mesh = init_device_mesh(device.type, (pp, dp, cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp"))
    if cp > 1:
        mesh["dp", "cp"]._flatten("dp_cp")
    return mesh


def data_mesh(mesh: DeviceMesh) -> DeviceMesh:
    """The dense weights' data-parallel mesh: dp, or dp x cp flattened where cp > 1 (each cp rank
    computes the gradient of its own tokens, so the cp ranks average like data-parallel ones).

    Flattening again returns the mesh `build_mesh` made (torch keeps it on the root mesh); slicing
    "dp_cp" out of the root mesh is deprecated in torch.
    """
    return mesh["dp", "cp"]._flatten("dp_cp") if mesh["cp"].size() > 1 else mesh["dp"]


def expert_mesh(mesh: DeviceMesh, ep: int) -> DeviceMesh | None:
    """pp x edp x ep over the same ranks: each pipeline stage's dp*cp ranks (flattened, dp outer)
    cut into groups of ep consecutive ranks holding different experts (the "ep" dimension), and
    "edp", the expert data parallel ranks holding the same experts, world/(ep*pp) of them
    (Megatron-LM's expert mesh with etp = 1). None where ep = 1.

    Only with tp = 1: with tp > 1 and etp = 1 Megatron-LM folds the tp ranks into the expert
    mesh as well, which the built-in trainer does not run (the plan refuses it).
    """
    if ep == 1:
        return None
    pp, dp, cp, tp = mesh.mesh.shape
    if tp != 1:
        raise ValueError(f"expert parallelism with tp = {tp}: the built-in trainer runs it with tp = 1 only")
    if (dp * cp) % ep:
        raise ValueError(f"ep = {ep} does not divide dp*cp = {dp}*{cp}")
    ranks = mesh.mesh.reshape(pp, dp * cp // ep, ep)
    return DeviceMesh(mesh.device_type, ranks, mesh_dim_names=("pp", "edp", "ep"))


class PeakMemory:
    """Peak memory of this process from `start()` on. CUDA: allocator peaks; CPU: resident-set growth.

    On CPU the kernel's high-water mark (VmHWM) is reset through /proc/self/clear_refs, and the
    growth over the resident set at `start()` is reported (the interpreter, torch and the
    process group are not the trial's). `mark_warm()` after the warm-up steps starts a second,
    steady-state peak: the kernel probes and the first step's one-off work (compilation, lazy
    allocations) inflate the overall one.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base_bytes = 0
        self.before_warm: tuple[float, float | None] | None = None

    def start(self) -> None:
        self._reset()
        if self.device.type != "cuda":
            self.base_bytes = _proc_status_kib("VmRSS") * 1024

    def _reset(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass

    def mark_warm(self) -> None:
        """Keep the peak so far, and measure the steady-state peak from here on."""
        self.before_warm = self._current_peaks()
        self._reset()

    def _current_peaks(self) -> tuple[float, float | None]:
        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device)), float(
                torch.cuda.max_memory_reserved(self.device)
            )
        return float(max(0, _proc_status_kib("VmHWM") * 1024 - self.base_bytes)), None

    def peak_bytes(self) -> tuple[float, float | None]:
        """(peak allocated or RSS growth, peak reserved or None), over the whole run."""
        now = self._current_peaks()
        if self.before_warm is None:
            return now
        alloc = max(now[0], self.before_warm[0])
        reserved = None if now[1] is None else max(now[1], self.before_warm[1] or 0.0)
        return alloc, reserved

    def steady_bytes(self) -> float:
        """Peak allocated (CPU: RSS growth) since `mark_warm()`; the whole run's without a mark."""
        return self._current_peaks()[0]


def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (nothing to wait for on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
