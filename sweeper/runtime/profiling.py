"""The measurements of `sweep profile` on this process's device: GEMMs, attention kernels,
memory-bound operations eager and compiled, and the host's launch overhead.

Each is timed as the built-in trainer runs it: GEMMs as `F.linear` and its two backward products
in the compute dtype, attention through `sweeper.runtime.kernels` (each kernel probed first; one
this device cannot run is left out), the norms, RoPE, activations and loss as `sweeper.runtime.model`
computes them. A time is the median of three batches of repetitions (a batch lasts `budget_s`).
The block and collectives are `sweeper.runtime.profile_block` and `profile_comm`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sweeper.estimate.shapes import MeasurePlan
from sweeper.profiles.profile import AttentionPoint, ElementwisePoint, GemmPoint
from sweeper.runtime import kernels
from sweeper.runtime.model import apply_rope, eager_layernorm, fused_layernorm, loss_fn, rope_tables

Progress = Callable[[str], None]
ROPE_HEAD_DIM = 64  # RoPE's cost is per element; a 64-wide head where the width allows it
NORM_EPS = 1e-5


@dataclass(frozen=True)
class Timer:
    """Seconds per call of a function on `device`, synchronising a GPU around each batch."""

    device: torch.device
    budget_s: float = 0.02
    max_reps: int = 50
    batches: int = 3
    # every rank of the process group times `fn` at once (collectives inside it): the repetitions are
    # agreed from the slowest rank's first call, or a loaded rank would run fewer collectives than the
    # others and gloo would fail ("Received data size doesn't match expected size")
    together: bool = False

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, fn: Callable[[], object]) -> float:
        fn()  # warm: kernel selection, allocator, compilation
        self.sync()
        start = time.perf_counter()
        fn()
        self.sync()
        once = max(time.perf_counter() - start, 1e-7)
        if self.together:
            import torch.distributed as dist

            slowest = torch.tensor([once], dtype=torch.float64, device=self.device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            once = float(slowest.item())
        reps = int(min(self.max_reps, max(1, self.budget_s / once)))
        batches = []
        for _ in range(self.batches):
            start = time.perf_counter()
            for _ in range(reps):
                fn()
            self.sync()
            batches.append((time.perf_counter() - start) / reps)
        return statistics.median(batches)


def dtype_of(name: str) -> torch.dtype:
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def fp8_supported(device: torch.device) -> bool:
    """A CUDA card with fp8 tensor cores (compute capability 8.9 or more) and torch's fp8 GEMM."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


# ---- GEMMs ----------------------------------------------------------------------------------------
def measure_gemm(
    shapes: list[tuple[int, int, int]], *, dtype: str, timer: Timer, progress: Progress
) -> list[GemmPoint]:
    """y = x W^T (x: m x k, W: n x k) forward, and backward's dX = dY W and dW = dY^T x."""
    out = []
    for i, shape in enumerate(shapes):
        if i % 10 == 0:
            progress(f"GEMM {dtype} {i + 1}/{len(shapes)}")
        out.append(_gemm_point(shape, dtype=dtype, timer=timer))
    return out


def _gemm_point(shape: tuple[int, int, int], *, dtype: str, timer: Timer) -> GemmPoint:
    m, n, k = shape
    tdtype = dtype_of(dtype)
    x = torch.randn(m, k, device=timer.device, dtype=tdtype)
    w = torch.randn(n, k, device=timer.device, dtype=tdtype)
    dy = torch.randn(m, n, device=timer.device, dtype=tdtype)
    fwd = timer(lambda: F.linear(x, w))
    bwd = timer(lambda: (dy @ w, dy.t() @ x))
    return GemmPoint(dtype=dtype, m=m, n=n, k=k, fwd_s=fwd, bwd_s=bwd)


def measure_gemm_fp8(shapes: list[tuple[int, int, int]], *, timer: Timer, progress: Progress) -> list[GemmPoint]:
    """The same products in fp8 (torch._scaled_mm, e4m3 forward, e5m2 gradients, bf16 out) where every
    dimension is a multiple of 16 (what the fp8 GEMM takes); the casts are measured apart (fp8_cast)."""
    usable = [s for s in shapes if all(v % 16 == 0 for v in s)]
    out = []
    for i, shape in enumerate(usable):
        if i % 10 == 0:
            progress(f"GEMM fp8 {i + 1}/{len(usable)}")
        out.append(_fp8_point(shape, timer=timer))
    return out


def _fp8_point(shape: tuple[int, int, int], *, timer: Timer) -> GemmPoint:
    m, n, k = shape
    dev = timer.device
    one = torch.ones((), device=dev, dtype=torch.float32)
    x = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    w_col = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t()  # k x n, column-major
    dy = torch.randn(m, n, device=dev).to(torch.float8_e5m2)
    w_nk_col = torch.randn(k, n, device=dev).to(torch.float8_e4m3fn).t()  # n x k, column-major
    dy_t = torch.randn(n, m, device=dev).to(torch.float8_e5m2)  # dY^T, row-major
    x_col = torch.randn(k, m, device=dev).to(torch.float8_e4m3fn).t()  # m x k, column-major

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    fwd = timer(lambda: mm(x, w_col))
    bwd = timer(lambda: (mm(dy, w_nk_col), mm(dy_t, x_col)))
    return GemmPoint(dtype="fp8", m=m, n=n, k=k, fwd_s=fwd, bwd_s=bwd)


# ---- attention --------------------------------------------------------------------------------------
def measure_attention(
    shapes: list[tuple[int, int, int, int, int]],
    *,
    kernel_names: tuple[str, ...],
    dtype: str,
    timer: Timer,
    progress: Progress,
) -> tuple[list[AttentionPoint], dict[str, str]]:
    """Each kernel the trainer has, at each (batch, heads, kv_heads, head_dim, seq); returns the points
    and, per kernel left out, why (the probe's KernelUnavailable, or memory)."""
    points, skipped = [], {}
    tdtype = dtype_of(dtype)
    for name in kernel_names:
        progress(f"attention {name}")
        for b, h, kv, d, s in shapes:
            try:
                fn = kernels.attention_kernel(
                    name, heads=h, kv_heads=kv, head_dim=d, seq_len=s, dtype=tdtype, device=timer.device, batch=b
                )
                points.append(_attention_point(name, fn, (b, h, kv, d, s), dtype=tdtype, timer=timer))
            except kernels.KernelUnavailable as e:
                skipped[name] = " ".join(str(e).split())[:200]
                break
            except torch.OutOfMemoryError:  # this shape does not fit with this kernel: the others may
                skipped[f"{name} at batch {b}, seq {s}"] = "out of memory"
            finally:
                if timer.device.type == "cuda":
                    torch.cuda.empty_cache()
    return points, skipped


def _attention_point(
    name: str, fn: kernels.AttentionFn, shape: tuple[int, int, int, int, int], *, dtype: torch.dtype, timer: Timer
) -> AttentionPoint:
    b, h, kv, d, s = shape

    def make(heads: int) -> torch.Tensor:  # made as the model makes them: (b, s, heads, d) seen transposed
        t = torch.randn(b, s, heads, d, device=timer.device, dtype=dtype, requires_grad=True)
        return t.transpose(1, 2)

    q, k, v = make(h), make(kv), make(kv)
    grad = torch.randn(b, h, s, d, device=timer.device, dtype=dtype)
    fwd = timer(lambda: fn(q, k, v))
    both = timer(lambda: fn(q, k, v).backward(grad))
    return AttentionPoint(
        kernel=name, batch=b, heads=h, kv_heads=kv, head_dim=d, seq=s, fwd_s=fwd, bwd_s=max(both - fwd, 0.05 * fwd)
    )


# ---- memory-bound work ------------------------------------------------------------------------------
def _rmsnorm(mode: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    fn = kernels.rmsnorm_kernel("fused" if mode == "fused" else "eager")
    return lambda x, w, _b: fn(x, w, NORM_EPS).type_as(x)


def _layernorm(mode: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    fn = fused_layernorm if mode == "fused" else eager_layernorm
    return lambda x, w, b: fn(x, w, b, NORM_EPS).type_as(x)


def elementwise_case(
    op: str, mode: str, rows: int, width: int, *, dtype: torch.dtype, device: torch.device
) -> tuple[Callable[[], torch.Tensor], list[torch.Tensor]]:
    """A function computing `op` the way the trainer does on inputs of `rows` x `width` elements,
    and the inputs that take gradients."""

    def leaf(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dt, requires_grad=True)

    if op in ("rmsnorm", "layernorm"):
        x, w, b = leaf(rows, width), leaf(width, dt=torch.float32), leaf(width, dt=torch.float32)
        norm = _rmsnorm(mode) if op == "rmsnorm" else _layernorm(mode)
        return (lambda: norm(x, w, b)), [x, w, b]
    if op == "rope":
        d = ROPE_HEAD_DIM if width % ROPE_HEAD_DIM == 0 else width
        x = leaf(1, width // d, rows, d)
        cos, sin = rope_tables(rows, d, device)
        return (lambda: apply_rope(x, cos, sin)), [x]
    if op in ("swiglu", "gelu"):
        a, g = leaf(rows, width), leaf(rows, width)
        if op == "gelu":
            return (lambda: F.gelu(a, approximate="tanh")), [a]
        return (lambda: F.silu(a) * g), [a, g]
    if op == "add":
        a, c = leaf(rows, width), leaf(rows, width)
        return (lambda: a + c), [a, c]
    if op == "cross_entropy":
        logits = leaf(1, rows, width)
        labels = torch.randint(0, width, (1, rows), device=device)
        return (lambda: loss_fn(logits, labels)), [logits]
    raise ValueError(f"no memory-bound case for op {op!r}")


def measure_elementwise(
    cases: list[tuple[str, int, int]],
    *,
    modes: dict[str, tuple[str, ...]],
    dtype: str,
    timer: Timer,
    progress: Progress,
) -> list[ElementwisePoint]:
    """Each (op, rows, width) in each of the op's modes (eager; fused norms), forward and forward +
    backward; adamw as one fused optimizer step over that many fp32 parameters."""
    out = []
    tdtype = dtype_of(dtype)
    progress(f"memory-bound work: {len(cases)} cases")
    for op, rows, width in cases:
        if op == "adamw":
            out.append(_adamw(rows, timer))
            continue
        for mode in modes.get(op, ("eager",)):
            out.append(_elementwise_point(op, mode, rows, width, fn_of=lambda f: f, dtype=tdtype, timer=timer))
    return out


def _elementwise_point(
    op: str,
    mode: str,
    rows: int,
    width: int,
    *,
    fn_of: Callable[[Callable[[], torch.Tensor]], Callable[[], torch.Tensor]],
    dtype: torch.dtype,
    timer: Timer,
) -> ElementwisePoint:
    fn, leaves = elementwise_case(
        op, "fused" if mode == "fused" else "eager", rows, width, dtype=dtype, device=timer.device
    )
    fn = fn_of(fn)
    fwd = timer(fn)  # with autograd recording, as in training and in a checkpoint's recompute
    grad = torch.ones_like(fn())

    def both() -> None:
        fn().backward(grad)
        for t in leaves:
            t.grad = None

    total = timer(both)
    return ElementwisePoint(op=op, mode=mode, elements=rows * width, fwd_s=fwd, bwd_s=max(total - fwd, 0.0))


def measure_compiled(
    cases: list[tuple[str, int, int]], *, dtype: str, timer: Timer, progress: Progress
) -> tuple[list[ElementwisePoint], str | None]:
    """The block's memory-bound ops under torch.compile, at the largest size of each (the model
    scales the eager curve by the compiled/eager ratio measured there); returns why not, if compile fails."""
    largest: dict[str, tuple[str, int, int]] = {}
    for case in cases:
        if case[0] in ("rmsnorm", "layernorm", "rope", "swiglu", "gelu", "add"):
            op, rows, width = case
            if op not in largest or rows * width > largest[op][1] * largest[op][2]:
                largest[op] = case
    out = []
    for op, rows, width in largest.values():
        progress(f"compiled {op} at {rows * width:,} elements")
        try:
            out.append(
                _elementwise_point(op, "compiled", rows, width, fn_of=_compiled, dtype=dtype_of(dtype), timer=timer)
            )
        except Exception as e:  # noqa: BLE001 - a compiler that fails here fails in the trial: say why, go on
            return out, f"torch.compile failed on {op}: {' '.join(str(e).split())[:200]}"
    return out, None


def _compiled(fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
    return torch.compile(fn, dynamic=False)


def _adamw(params: int, timer: Timer) -> ElementwisePoint:
    """One step of the trainer's AdamW (fused where the device has it) over `params` fp32 parameters."""
    p = torch.nn.Parameter(torch.zeros(params, device=timer.device))
    p.grad = torch.randn_like(p)
    fused = timer.device.type in ("cuda", "cpu")
    opt = torch.optim.AdamW([p], lr=1e-4, fused=fused, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    return ElementwisePoint(
        op="adamw", mode="fused" if fused else "eager", elements=params, fwd_s=timer(opt.step), bwd_s=0.0
    )


def measure_fp8_cast(cases: list[tuple[str, int, int]], *, timer: Timer) -> list[ElementwisePoint]:
    """float8's dynamic scaling of one tensor: its amax, the scale, the cast to e4m3 (torchao's path)."""
    out = []
    for rows, width in sorted({(r, w) for op, r, w in cases if op in ("add", "swiglu")}):
        x = torch.randn(rows, width, device=timer.device, dtype=torch.bfloat16)

        def cast(x: torch.Tensor = x) -> torch.Tensor:
            scale = 448.0 / x.abs().max().float().clamp(min=1e-12)
            return (x.float() * scale).to(torch.float8_e4m3fn)

        out.append(ElementwisePoint(op="fp8_cast", mode="eager", elements=rows * width, fwd_s=timer(cast), bwd_s=0.0))
    return out


def measure_launch(device: torch.device, *, chain: int = 200) -> float:
    """Host time of one small eager op with autograd, forward and backward: a chain of `chain`
    multiplications of a one-element tensor and its backward, per link."""
    x = torch.ones(1, device=device, requires_grad=True)

    def run() -> None:
        y = x
        for _ in range(chain):
            y = y * 1.0001
        y.backward()

    return Timer(device, budget_s=0.05)(run) / chain


def modes_for(plan: MeasurePlan) -> dict[str, tuple[str, ...]]:
    """The modes each op is measured in: the norms in each kernel the plan asks for, the rest eager."""
    return {"rmsnorm": plan.norms, "layernorm": plan.norms}
