"""Where a trial runs: its rank and world from torchrun or SLURM/submitit variables, its device, its mesh.

The process group is created on a rendezvous store that this module keeps, so the ranks can
also use the store to agree on a trial's outcome without any collective (see `outcome.py`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from sweeper.launchers.process import free_port


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
                int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", env["RANK"])),
                env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500")),
                env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true",
            )
        return cls(0, 1, 0, "127.0.0.1", free_port())


def pick_device(env: DistEnv) -> torch.device:
    """One GPU per local rank when CUDA is there, else the CPU."""
    if torch.cuda.is_available():
        device = torch.device("cuda", env.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def connect_store(env: DistEnv, *, timeout_s: float, server: bool) -> dist.Store:
    """A client (or, on rank 0, the server) of the rendezvous store."""
    return dist.TCPStore(
        env.master_addr, env.master_port, env.world_size if server else None, is_master=server,
        timeout=timedelta(seconds=timeout_s), wait_for_workers=False,
    )


def init_distributed(env: DistEnv, device: torch.device, *, timeout_s: float) -> dist.Store:
    """Start the process group (NCCL on GPUs, gloo on CPU); returns the store it was built on."""
    store = connect_store(env, timeout_s=timeout_s, server=env.rank == 0 and not env.agent_store)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, store=dist.PrefixStore("pg", store), rank=env.rank, world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s), device_id=device if device.type == "cuda" else None,
    )
    return store


def build_mesh(device: torch.device, *, pp: int, dp: int, tp: int) -> DeviceMesh:
    """pp x dp x tp with tp innermost: tensor-parallel peers are neighbouring ranks (one node)."""
    return init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))


def process_start_unix() -> float | None:
    """When this process started (seconds since the epoch), from /proc; None where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


class PeakMemory:
    """Peak memory of this process from `start()` on. CUDA: allocator peaks; CPU: resident-set growth.

    On CPU the kernel's high-water mark (VmHWM) is reset through /proc/self/clear_refs, and the
    growth over the resident set at `start()` is reported (the interpreter, torch and the
    process group are not the trial's).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.base_bytes = 0

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass
        self.base_bytes = _proc_status_kib("VmRSS") * 1024

    def peak_bytes(self) -> tuple[float, float | None]:
        """(peak allocated or RSS growth, peak reserved or None)."""
        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device)), float(torch.cuda.max_memory_reserved(self.device))
        return float(max(0, _proc_status_kib("VmHWM") * 1024 - self.base_bytes)), None


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
