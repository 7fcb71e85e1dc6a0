"""`sweep selftest`: what a sweep relies on, checked on this node before spending a node-week.

Every check yields one `Check` row: the CUDA build and driver, the GPU and its table entry, NCCL,
each attention/RMSNorm/float8 kernel probe, the matmul TFLOP/s reached against the card's peak
(MFU's denominator), small layouts (TP, PP, FSDP, DDP) run for real on `gpus` processes with the
memory estimate against the measured peak, and the all-reduce bandwidth within the node. A check
that fails where a sweep relies on it (`relied`) makes the command exit 1.

On a CPU the same checks run where they can (kernels, matmul, the layouts over gloo) and the
CUDA rows say what is missing.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sweeper.errors import one_line
from sweeper.spec.hardware import GPU, GPUS, gpu_matches
from sweeper.statuses import TrialStatus

# The four parallelisms a sweep combines, each on its own on `gpus` processes.
SELFTEST_LAYOUTS: dict[str, dict[str, Any]] = {
    "TP": {"tp": 2, "pp": 1, "sharding": "none"},
    "PP": {"tp": 1, "pp": 2, "sharding": "none"},
    "FSDP": {"tp": 1, "pp": 1, "sharding": "fsdp"},
    "DDP": {"tp": 1, "pp": 1, "sharding": "none"},
}
# Below this share of the table's peak, MFU's denominator is not what this card reaches.
MATMUL_WARN_SHARE = 0.5
# Below this share of the table's intra-node bandwidth, the throughput model's comm times are off.
BANDWIDTH_WARN_SHARE = 0.3


class Verdict(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "FAIL"
    SKIP = "skip"


@dataclass(frozen=True)
class Check:
    """One row of the self-test table."""

    group: str
    name: str
    verdict: Verdict
    detail: str
    relied: bool = True  # a sweep relies on it: a FAIL makes the self-test exit 1


@dataclass
class Report:
    checks: list[Check]

    @property
    def broken(self) -> list[Check]:
        return [c for c in self.checks if c.verdict == Verdict.FAIL and c.relied]

    @property
    def exit_code(self) -> int:
        return 1 if self.broken else 0


def _guard(group: str, name: str, fn: Callable[[], list[Check]]) -> list[Check]:
    """Run one check; an unexpected exception is that check's FAIL, never a crash of the self-test."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - reported as a row
        return [Check(group, name, Verdict.FAIL, f"{type(e).__name__}: {one_line(e)}")]


def table_gpu(detected: str) -> GPU | None:
    """The GPU table's entry for a driver's card name, or None."""
    return next((g for g in GPUS.values() if g.name != "cpu" and gpu_matches(g, detected)), None)


def environment_checks() -> tuple[list[Check], Any, GPU | None]:
    """CUDA, the GPU and NCCL; returns the rows, the device to probe on, and the card's table entry."""
    import torch

    from sweeper.runtime.env import (
        cuda_unusable_reason,
        prepare_process_environment,
        runtime_versions,
    )

    prepare_process_environment()
    rows = [Check("environment", "torch", Verdict.PASS, f"torch {torch.__version__}", relied=False)]
    reason = cuda_unusable_reason()
    if reason is not None:
        rows.append(Check("environment", "CUDA", Verdict.FAIL, f"{reason}: a GPU sweep cannot run here"))
        rows.append(Check("environment", "NCCL", Verdict.SKIP, "no CUDA, no NCCL: multi-GPU trials need both"))
        return rows, torch.device("cpu"), GPUS["cpu"]
    device = torch.device("cuda", 0)
    versions = runtime_versions(device)
    name = versions["gpu_name"] or "?"
    count = torch.cuda.device_count()
    cap = torch.cuda.get_device_capability(device)
    rows.append(
        Check(
            "environment",
            "CUDA",
            Verdict.PASS,
            f"CUDA {versions['cuda_version']}, {count} x {name} (compute capability {cap[0]}.{cap[1]})",
        )
    )
    gpu = table_gpu(name)
    rows.append(
        Check(
            "environment",
            "GPU table",
            Verdict.PASS if gpu else Verdict.WARN,
            f"{name} is {gpu.name} in the GPU table"
            if gpu
            else f"{name} matches no GPU table entry: give cluster.gpu as {{memory_gib, peak_tflops}}",
            relied=False,
        )
    )
    nccl = versions["nccl_version"]
    rows.append(
        Check(
            "environment",
            "NCCL",
            Verdict.PASS if nccl else Verdict.FAIL,
            f"NCCL {nccl}" if nccl else "this torch has no NCCL: multi-GPU trials cannot run",
        )
    )
    return rows, device, gpu


def kernel_checks(device: Any, *, seq_len: int = 1024, heads: int = 16, head_dim: int = 128) -> list[Check]:
    """Every attention and RMSNorm kernel and float8, probed here; unavailable ones are information
    (a sweep learns them), but eager attention and RMSNorm must run."""
    import torch

    from sweeper.knobs import KNOBS
    from sweeper.runtime import kernels

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type != "cuda":
        seq_len, heads, head_dim = 128, 4, 32  # the same code paths, at a size a CPU probes quickly
    rows = []
    for name in KNOBS["attention"].choices:
        try:
            kernels.attention_kernel(
                name, heads=heads, kv_heads=heads, head_dim=head_dim, seq_len=seq_len, dtype=dtype, device=device
            )
            rows.append(Check("kernels", f"attention={name}", Verdict.PASS, "runs", relied=name == "eager"))
        except kernels.KernelUnavailable as e:
            rows.append(
                Check(
                    "kernels",
                    f"attention={name}",
                    Verdict.FAIL if name == "eager" else Verdict.SKIP,
                    f"unavailable: {one_line(e)}",
                    relied=name == "eager",
                )
            )
    for name in KNOBS["rmsnorm"].choices:
        try:
            fn = kernels.rmsnorm_kernel(name)
            x = torch.randn(2, 8, head_dim, device=device, dtype=dtype)
            fn(x, torch.ones(head_dim, device=device, dtype=dtype), 1e-5)
            rows.append(Check("kernels", f"rmsnorm={name}", Verdict.PASS, "runs", relied=name == "eager"))
        except kernels.KernelUnavailable as e:
            rows.append(Check("kernels", f"rmsnorm={name}", Verdict.SKIP, f"unavailable: {one_line(e)}", relied=False))
    try:
        kernels.check_float8(device)
        rows.append(Check("kernels", "float8", Verdict.PASS, "fp8 matmuls and torchao present", relied=False))
    except kernels.KernelUnavailable as e:
        rows.append(Check("kernels", "float8", Verdict.SKIP, f"unavailable: {e}", relied=False))
    return rows


def matmul_check(device: Any, gpu: GPU | None) -> list[Check]:
    """Dense matmul TFLOP/s against the table's peak for the precision a sweep runs in."""
    import torch

    cuda = device.type == "cuda"
    n, dtype, precision = (8192, torch.bfloat16, "bf16") if cuda else (1024, torch.float32, "fp32")
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    reps = 20 if cuda else 5
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    if cuda:
        torch.cuda.synchronize(device)
    tflops = 2 * n**3 * reps / (time.perf_counter() - start) / 1e12
    if gpu is None:
        return [
            Check(
                "throughput",
                f"matmul {precision}",
                Verdict.WARN,
                f"{tflops:.1f} TFLOP/s; no table peak to compare with",
            )
        ]
    peak = gpu.peak_flops(precision) / 1e12
    share = tflops / peak
    verdict = Verdict.PASS if share >= MATMUL_WARN_SHARE or not cuda else Verdict.WARN
    note = "" if cuda else " (a CPU's table peak is nominal)"
    return [
        Check(
            "throughput",
            f"matmul {precision} {n}^3",
            verdict,
            f"{tflops:.2f} TFLOP/s = {share:.0%} of {gpu.name}'s {peak:g} TFLOP/s peak{note}",
            relied=False,
        )
    ]


def selftest_sweep_text(gpu: GPU | None, gpus: int, *, cuda: bool, memory_gib: float = 80.0) -> str:
    """A small model over `gpus` processes of one node, every layout of SELFTEST_LAYOUTS in its space."""
    model = (
        "{layers: 4, hidden: 1024, heads: 16, kv_heads: 8, ffn: 2816, vocab: 32000}"
        if cuda
        else "{layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 176, vocab: 256}"
    )
    card = gpu.name if gpu is not None else f"{{name: this-gpu, memory_gib: {memory_gib:.1f}, peak_tflops: 1000}}"
    return f"""name: selftest
model: {model}
seq_len: {1024 if cuda else 64}
global_batch_size: {2 * gpus}
cluster: {{nodes: 1, gpus_per_node: {gpus}, gpu: {card}}}
space: {{tp: [1, 2], pp: [1, 2], micro_batch_size: [1], sharding: [none, fsdp], attention: [{"flash2" if cuda else "sdpa_math"}]}}
trial: {{steps: 4, warmup_steps: 1, timeout_min: 5, precision: {"bf16" if cuda else "fp32"}}}
launcher: local
"""


def layout_checks(gpu: GPU | None, gpus: int, *, cuda: bool, workdir: Path) -> list[Check]:
    """Each of TP, PP, FSDP, DDP for real on `gpus` local processes; estimate against measured peak."""
    import torch

    from sweeper.launchers.forking import warm_zygote
    from sweeper.launchers.ranks import launch_trial
    from sweeper.layouts.layout import Layout
    from sweeper.plan.plan import make_plan
    from sweeper.spec.loader import parse_sweep

    memory = torch.cuda.get_device_properties(0).total_memory / 1024**3 if cuda else 4.0
    sweep = parse_sweep(selftest_sweep_text(gpu, gpus, cuda=cuda, memory_gib=memory), source="<selftest>")
    plan = make_plan(sweep)
    rows = []
    # one warm zygote for the four launches: torch, dynamo and the trainer imported once
    with warm_zygote(workdir) as env:
        for label, knobs in SELFTEST_LAYOUTS.items():
            layout = Layout.from_mapping(
                {**knobs, "micro_batch_size": 1, "attention": "flash2" if cuda else "sdpa_math"}
            )
            index = next((i for i in range(len(plan)) if plan.layout(i) == layout), None)
            predicted = float(plan.memory.total[index]) / 1024**3 if index is not None else None
            result = launch_trial(sweep, layout, workdir=workdir / label, extra_env=env)
            if result.status != TrialStatus.OK:
                rows.append(Check("layouts", label, Verdict.FAIL, f"{result.status}: {one_line(result.error or '')}"))
                continue
            measured = result.peak_mem_gib or 0.0
            what = "peak allocated" if cuda else "peak RSS growth"
            mem = f"; estimate {predicted:.3f} GiB vs {what} {measured:.3f} GiB" if predicted is not None else ""
            rows.append(
                Check(
                    "layouts",
                    f"{label} on {gpus}",
                    Verdict.PASS,
                    f"{result.tokens_per_s:.0f} tokens/s, MFU {result.mfu:.1%}{mem}",
                )
            )
    return rows


def allreduce_worker(*, out_dir: Path, megabytes: int = 256, reps: int = 10) -> None:
    """On every rank of a local launch: time all-reduces; rank 0 writes the bus bandwidth (NCCL's
    definition: 2(n-1)/n x bytes / time)."""
    import torch
    import torch.distributed as dist

    from sweeper.runtime.env import DistEnv, init_distributed, pick_device

    env = DistEnv.from_environ()
    device = pick_device(env)
    init_distributed(env, device, timeout_s=120)
    x = torch.ones(megabytes * 1024**2 // 4, device=device)
    for _ in range(3):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        dist.all_reduce(x)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - start) / reps
    n = env.world_size
    if env.rank == 0:
        busbw = 2 * (n - 1) / n * x.numel() * 4 / elapsed / 1e9
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "allreduce.json").write_text(json.dumps({"busbw_gbps": busbw, "backend": dist.get_backend()}))
    dist.destroy_process_group()


def bandwidth_check(gpu: GPU | None, gpus: int, *, workdir: Path) -> list[Check]:
    from sweeper.launchers.ranks import launch

    done = launch(
        {"kind": "call", "target": "sweeper.run.selftest:allreduce_worker", "kwargs": {}},
        nprocs=gpus,
        timeout_s=300,
        workdir=workdir,
    )
    path = done.out_dir / "allreduce.json"
    if not path.exists():
        return [Check("network", f"all-reduce on {gpus}", Verdict.FAIL, f"no result: {done.log_tail(0, 3)}")]
    data = json.loads(path.read_text())
    bw = data["busbw_gbps"]
    if gpu is None:
        return [
            Check("network", f"all-reduce on {gpus}", Verdict.WARN, f"{bw:.1f} GB/s bus bandwidth; no table figure")
        ]
    share = bw / gpu.intra_gbps
    verdict = Verdict.PASS if share >= BANDWIDTH_WARN_SHARE else Verdict.WARN
    return [
        Check(
            "network",
            f"all-reduce on {gpus} ({data['backend']})",
            verdict,
            f"{bw:.1f} GB/s bus bandwidth = {share:.0%} of cluster.intra_node_gbps default {gpu.intra_gbps:g} GB/s",
            relied=False,
        )
    ]


def run_selftest(*, gpus: int | None = None, workdir: Path | None = None) -> Report:
    """Every check, in order; never raises."""
    try:
        checks, device, gpu = environment_checks()
    except Exception as e:  # noqa: BLE001 - torch itself is broken: that is the report
        return Report([Check("environment", "torch", Verdict.FAIL, f"{type(e).__name__}: {one_line(e)}")])
    cuda = device.type == "cuda"
    checks += _guard("kernels", "probes", lambda: kernel_checks(device))
    checks += _guard("throughput", "matmul", lambda: matmul_check(device, gpu))
    import torch

    n = gpus if gpus is not None else 2
    if n < 2:
        checks.append(
            Check("layouts", "TP/PP/FSDP/DDP", Verdict.SKIP, "--gpus 1: parallel layouts need 2 or more", relied=False)
        )
        return Report(checks)
    if cuda and torch.cuda.device_count() < n:
        checks.append(Check("layouts", f"on {n} GPUs", Verdict.FAIL, f"only {torch.cuda.device_count()} GPUs visible"))
        return Report(checks)
    with tempfile.TemporaryDirectory(prefix="sweep-selftest-") as tmp:
        root = Path(workdir) if workdir is not None else Path(tmp)
        checks += _guard(
            "layouts", "TP/PP/FSDP/DDP", lambda: layout_checks(gpu, n, cuda=cuda, workdir=root / "layouts")
        )
        if cuda:
            checks += _guard("network", "all-reduce", lambda: bandwidth_check(gpu, n, workdir=root / "allreduce"))
        else:
            checks.append(
                Check(
                    "network",
                    "all-reduce (NCCL)",
                    Verdict.SKIP,
                    "no GPUs: NCCL bandwidth not measurable on a CPU",
                    relied=False,
                )
            )
    return Report(checks)
