"""`run_trial`: one layout for `trial.steps` optimizer steps on every rank of a job, measured by the protocol.

Called on every rank, under torchrun-style variables or in a SLURM/submitit task. Every rank
returns a `TrialResult` (rank 0's holds the measurements) and, given `out_dir`, writes
`rank<r>.json` (its view of the outcome) and, on rank 0, `result.json` (the whole result).
The files are what a launcher should read: a rank stuck in a collective after a peer failed
writes them and ends its process (see `outcome.Watcher`), so it never returns.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from sweeper.files import atomic_write_text
from sweeper.layouts.layout import Layout
from sweeper.process import process_start_unix
from sweeper.results.trial import FAILED, NO_ACCELERATOR, STEPS_FILE, TrialResult, summarize, without_run
from sweeper.runtime.env import (
    DistEnv,
    PeakMemory,
    build_mesh,
    connect_store,
    cuda_unusable_reason,
    init_distributed,
    pick_device,
    prepare_process_environment,
    runtime_versions,
    set_matmul_precision,
    synchronize,
)
from sweeper.runtime.outcome import Agreement, Failure, Watcher, classify
from sweeper.runtime.train import Trainer, build_trainer, reduce_losses
from sweeper.spec.hardware import GIB
from sweeper.spec.sweep import Sweep

FAULT_ENV = "SWEEP_FAULT"  # "KIND:RANK:STEP[,...]" (oom, error, hang, exit, linger): make ranks fail, for tests
# linger: the rank hangs after the trial's outcome is written (like a task stuck in NCCL teardown)
FAULT_KINDS = ("oom", "error", "hang", "exit", "linger")


@dataclass(frozen=True)
class Fault:
    """A failure injected on purpose at the start of one step on one rank."""

    kind: str
    rank: int
    step: int

    @classmethod
    def from_env(cls) -> list[Fault]:
        faults = []
        for spec in filter(None, os.environ.get(FAULT_ENV, "").split(",")):
            kind, rank, step = spec.split(":")
            if kind not in FAULT_KINDS:
                raise ValueError(f"{FAULT_ENV}={spec!r}: kind must be one of {', '.join(FAULT_KINDS)}")
            faults.append(cls(kind, int(rank), int(step)))
        return faults

    def fire(self, rank: int, step: int) -> None:
        if (rank, step) != (self.rank, self.step) or self.kind == "linger":
            return
        if self.kind == "oom":
            raise torch.OutOfMemoryError(f"injected by {FAULT_ENV}: out of memory at step {step}")
        if self.kind == "error":
            raise RuntimeError(f"injected by {FAULT_ENV}: failure at step {step}")
        if self.kind == "exit":
            os._exit(3)
        time.sleep(10**6)  # hang


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


def run_steps(
    trainer: Trainer,
    *,
    steps: int,
    rank: int,
    faults: list[Fault],
    warmup: int = 0,
    peak: PeakMemory | None = None,
    steps_file: Path | None = None,
) -> tuple[list[float], list[torch.Tensor], float]:
    """The protocol's loop: synchronise and take the wall time at the end of every step.

    After the `warmup` steps, `peak` starts its steady-state figure. Each step's time is appended
    to `steps_file` as it ends, so the sweep can stop a clearly slow trial early (`sweeper.run.slow_trials`).
    """
    times: list[float] = []
    losses: list[torch.Tensor] = []
    first_step_unix = time.time()
    last = time.perf_counter()
    for step in range(steps):
        for fault in faults:
            fault.fire(rank, step)
        losses.append(trainer.step())
        synchronize(trainer.device)
        now = time.perf_counter()
        times.append(now - last)
        if steps_file is not None:
            with open(steps_file, "a") as f:  # one whole line per write: a reader never sees half a number
                f.write(f"{times[-1]:.6f}\n")
        if peak is not None and step + 1 == warmup:
            peak.mark_warm()
            now = time.perf_counter()  # the reset is not the next step's time
        last = now
    return times, losses, first_step_unix


def _measure(
    sweep: Sweep,
    layout: Layout,
    env: DistEnv,
    device: torch.device,
    started: float | None,
    out_dir: Path | None = None,
) -> dict[str, Any]:
    world = sweep.cluster.world
    if env.world_size != world:
        raise RuntimeError(
            f"the layout needs tp*cp*pp*dp = {world} processes (the sweep's cluster), but {env.world_size} were started"
        )
    # (one GPU per rank is checked by pick_device: a task bound to its own GPU sees fewer devices than ranks)
    mesh = build_mesh(device, pp=layout.pp, dp=layout.dp(world), tp=layout.tp, cp=layout.cp)
    peak = PeakMemory(device)
    peak.start()
    settings = sweep.trial
    set_matmul_precision(settings.precision)
    trainer = build_trainer(
        sweep.model,
        layout,
        mesh=mesh,
        device=device,
        seq_len=sweep.seq_len,
        global_batch_size=sweep.global_batch_size,
        precision=settings.precision,
        seed=settings.seed,
        lr=settings.lr,
    )
    steps_file = out_dir / STEPS_FILE if (out_dir is not None and env.rank == 0) else None
    if steps_file is not None:
        steps_file.parent.mkdir(parents=True, exist_ok=True)
        steps_file.unlink(missing_ok=True)
    times, losses, first_step_unix = run_steps(
        trainer,
        steps=settings.steps,
        rank=env.rank,
        faults=Fault.from_env(),
        warmup=settings.warmup_steps,
        peak=peak,
        steps_file=steps_file,
    )
    peak_bytes, reserved = peak.peak_bytes()
    steady = peak.steady_bytes()
    startup = first_step_unix - started if started is not None else float("nan")
    # one MAX reduction for every per-rank figure: the slowest rank sets the step time
    maxed = torch.tensor(
        [*times, startup, peak_bytes, reserved if reserved is not None else -1.0, steady],
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
    m = maxed.tolist()
    n = len(times)
    return {
        "step_times_s": m[:n],
        "losses": reduce_losses(trainer, losses),
        "startup_s": None if math.isnan(m[n]) else m[n],
        "peak_mem_gib": m[n + 1] / GIB,
        "peak_mem_reserved_gib": m[n + 2] / GIB if m[n + 2] >= 0 else None,
        "peak_mem_steady_gib": m[n + 3] / GIB,
    }


class _Outputs:
    """The files a launcher reads: rank<r>.json on every rank (its outcome and when it knew it),
    result.json on rank 0; each written atomically, once."""

    def __init__(self, out_dir: Path | None, rank: int) -> None:
        self.out_dir, self.rank = out_dir, rank
        self.lock = threading.Lock()
        self.written = False

    def write(self, result: TrialResult) -> None:
        with self.lock:
            if self.written or self.out_dir is None:
                return
            self.out_dir.mkdir(parents=True, exist_ok=True)
            view = {"status": result.status, "error": result.error, "at_unix": time.time()}
            _atomic_json(self.out_dir / f"rank{self.rank}.json", view)
            if self.rank == 0:
                _atomic_json(self.out_dir / "result.json", result.to_dict())
            self.written = True


def _atomic_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data))


def _teardown(timeout_s: float = 10.0) -> None:
    """Destroy the process group, but never wait on it for long (a broken NCCL group can block)."""
    if not dist.is_initialized():
        return
    t = threading.Thread(target=dist.destroy_process_group, daemon=True)
    t.start()
    t.join(timeout_s)


def run_trial(sweep: Sweep, layout: Layout, *, out_dir: Path | None = None) -> TrialResult:
    """Run `layout` on this job's ranks; every rank ends with the same status (see module docstring)."""
    started = process_start_unix()
    prepare_process_environment()  # before anything initialises CUDA in this process
    env = DistEnv.from_environ()
    wants_gpu = sweep.cluster.gpu.name != "cpu"
    outputs = _Outputs(out_dir, env.rank)
    unusable = cuda_unusable_reason() if wants_gpu else None
    if unusable is not None:
        # Falling back to CPU + gloo would run a GPU-sized layout on the host until it times out
        # or is killed for memory, and be recorded as an oom: fail at once, and say why.
        result = without_run(
            sweep,
            layout,
            status=FAILED,
            error=f"{NO_ACCELERATOR}: the sweep's GPU is {sweep.cluster.gpu.name}, but {unusable}",
            device="cpu",
            **runtime_versions(torch.device("cpu")),
        )
        outputs.write(result)
        return result
    try:
        device = pick_device(env, want_cuda=wants_gpu)
    except RuntimeError as e:  # two ranks on one GPU: a launch or binding problem, not the layout's
        result = without_run(
            sweep,
            layout,
            status=FAILED,
            error=f"rank {env.rank}: {e}",
            device="cuda",
            **runtime_versions(torch.device("cpu")),
        )
        outputs.write(result)
        return result
    base = {"device": device_name(device), **runtime_versions(device)}
    timeout_s = max(60.0, sweep.trial.timeout_min * 60)
    try:
        store = init_distributed(env, device, timeout_s=timeout_s)
    except Exception as e:  # no process group: nothing to agree with
        result = without_run(sweep, layout, status=FAILED, error=classify(e, rank=env.rank).error, **base)
        outputs.write(result)
        return result

    def on_stuck(failure: Failure) -> None:
        outputs.write(without_run(sweep, layout, status=failure.status, error=failure.error, **base))

    agreement = Agreement(store, rank=env.rank)
    watcher = Watcher(connect_store(env, timeout_s=timeout_s, server=False), rank=env.rank, on_stuck=on_stuck).start()
    try:
        measured = _measure(sweep, layout, env, device, started, out_dir)
        result = summarize(sweep, layout, **measured, **base)
    except Exception as e:
        failure = agreement.resolve(e)
        result = without_run(sweep, layout, status=failure.status, error=failure.error, **base)
    finally:
        watcher.stop()
    outputs.write(result)
    if any(f.kind == "linger" and f.rank == env.rank for f in Fault.from_env()):
        time.sleep(10**6)
    # Leave the process group (bounded in time), then tell rank 0 this rank has its outcome.
    _teardown()
    try:
        agreement.acknowledge()
        if env.rank == 0:  # it serves the store: the others may still be reading the outcome
            agreement.wait_all_seen(env.world_size, timeout_s=watcher.grace_s + 3)
    except RuntimeError:
        pass  # the store is gone; every rank that can has written its outcome
    return result
