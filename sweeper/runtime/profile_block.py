"""One transformer block of the built-in trainer, forward and backward, at a tiny shape: the host's
overhead per block (launches, Python, autograd, checkpointing's wrapper, compile's guards).

At 16 tokens the arithmetic is negligible, so what this measures beyond the block's priced
operations at the same shape (`sweeper.estimate.profiled` subtracts them) is the framework's cost, per
value of each knob that changes the block's operations: the attention kernel, the norm kernel,
activation checkpointing and compile, each set in turn with the others at their base value.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable
from dataclasses import replace
from functools import partial

import torch
from torch.distributed.device_mesh import DeviceMesh

from sweeper.profiles.profile import DP_WRAPPER_DEPTHS, DP_WRAPPERS, BlockPoint
from sweeper.runtime import kernels
from sweeper.runtime.model import Transformer, build_model, materialize, norm_kernel
from sweeper.runtime.parallel import apply_ac, apply_compile, apply_ddp, apply_fsdp, apply_replicate, apply_tp
from sweeper.runtime.profiling import Progress, Timer
from sweeper.spec.models import ModelShape


def block_settings(values: dict[str, tuple[str, ...]]) -> list[tuple[str, str, dict[str, str]]]:
    """(knob, value, the block's settings) for the base (every knob at its first value) and each other
    value of each knob with the rest at base."""
    base = {knob: vals[0] for knob, vals in values.items()}
    out = [("base", "base", base)]
    for knob, vals in values.items():
        out += [(knob, v, base | {knob: v}) for v in vals[1:]]
    return out


def tiny_model(
    shape: ModelShape, settings: dict[str, str], *, rows: int, dtype: torch.dtype, device: torch.device, tp: int = 1
) -> Transformer:
    """The trainer's model of `shape` at `rows` tokens on the meta device, with the attention kernel and
    the norm `settings` name (the attention's heads those of one of `tp` ranks)."""
    attend = kernels.attention_kernel(
        settings["attention"],
        heads=shape.heads // tp,
        kv_heads=max(shape.kv_heads // tp, 1),
        head_dim=shape.head_dim,
        seq_len=rows,
        dtype=dtype,
        device=device,
    )
    return build_model(shape, rows, attend=attend, norm_fn=norm_kernel(shape, settings["rmsnorm"]))


def time_block(
    shape: ModelShape,
    settings: dict[str, str],
    *,
    rows: int,
    precision: str,
    timer: Timer,
    tp_mesh: DeviceMesh | None = None,
    sequence_parallel: bool = False,
) -> float:
    """Seconds of one block's forward and backward at `rows` tokens with `settings`; with `tp_mesh`,
    split over it as the trainer splits it (`parallel.apply_tp`; this rank's rows with SP)."""
    device = timer.device
    bf16 = precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    one = replace(shape, layers=1)
    tp = 1 if tp_mesh is None else tp_mesh.size()
    model = tiny_model(one, settings, rows=rows, dtype=dtype, device=device, tp=tp)
    if tp_mesh is not None:
        apply_tp(model, tp_mesh=tp_mesh, sequence_parallel=sequence_parallel)
    apply_ac(model, mode=settings["activation_checkpointing"])
    if settings["compile"] == "true":
        apply_compile(model)
    materialize(model, one, seed=0, device=device)
    block = model.layers["0"]
    cos, sin = model.rope_cos, model.rope_sin
    local_rows = rows // tp if sequence_parallel else rows
    x = torch.randn(1, local_rows, shape.hidden, device=device, dtype=dtype, requires_grad=True)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            out = block(x, cos, sin)
        out.backward(torch.ones_like(out))
        x.grad = None
        block.zero_grad(set_to_none=True)

    return timer(step)


def wrapped_step(
    shape: ModelShape,
    settings: dict[str, str],
    *,
    layers: int,
    wrapper: str,
    rows: int,
    precision: str,
    device: torch.device,
    mesh: DeviceMesh,
) -> Callable[[], None]:
    """One forward and backward of the whole tiny model at `rows` tokens and `layers` blocks, wrapped for
    data parallelism as the trainer wraps it (`DP_WRAPPERS`) on a mesh of this rank alone: the wrappers'
    hooks and their copies in and out of their buffers, without their collectives (which the profile
    prices by their span)."""
    bf16 = precision == "bf16"
    dtype = torch.bfloat16 if bf16 else torch.float32
    deep = replace(shape, layers=layers)
    model: torch.nn.Module = tiny_model(deep, settings, rows=rows, dtype=dtype, device=device)
    apply_ac(model, mode=settings["activation_checkpointing"])
    if wrapper == "fsdp":
        low = torch.bfloat16 if bf16 else None
        apply_fsdp(model, dp_mesh=mesh, param_dtype=low, reduce_dtype=torch.float32 if bf16 else None, pipelined=False)
    elif wrapper in ("replicate", "replicate_sync"):
        apply_replicate(model, dp_mesh=mesh)
    materialize(model, deep, seed=0, device=device)
    if wrapper == "ddp":
        model = apply_ddp(model, dp_mesh=mesh, device=device)
    if wrapper == "replicate":
        model.set_requires_gradient_sync(False)  # type: ignore[operator]  # FSDP2's ReplicateModule
    tokens = torch.randint(0, shape.vocab, (1, rows), device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            out = model(tokens)
        out.float().sum().backward()
        model.zero_grad(set_to_none=True)

    return step


def measure_wrapped(
    shape: ModelShape,
    settings: dict[str, str],
    *,
    rows: int,
    precision: str,
    timer: Timer,
    mesh: DeviceMesh,
    failed: dict[str, str],
    rounds: int,
) -> list[BlockPoint]:
    """The tiny model at each of `DP_WRAPPER_DEPTHS` unwrapped (knob `model`) and under each other of
    `DP_WRAPPERS` (knob: the wrapper; value: the blocks). What a wrapper adds is a difference of a few
    milliseconds on tens, so each round times the unwrapped model and then every wrapper, one batch
    each (a load that comes and goes hits the round's base and its wrappers alike); a wrapper's seconds
    are the unwrapped model's median plus the median of its rounds' differences from their base."""
    one = replace(timer, batches=1)
    out = []
    for layers in DP_WRAPPER_DEPTHS:
        make = partial(
            wrapped_step, shape, settings, layers=layers, rows=rows, precision=precision, device=timer.device, mesh=mesh
        )
        wrapped: dict[str, Callable[[], None]] = {}
        for wrapper in DP_WRAPPERS[1:]:
            try:
                wrapped[wrapper] = make(wrapper=wrapper)
            except Exception as e:  # noqa: BLE001 - a wrapper this torch cannot run is left out, with why
                failed[f"{wrapper} model"] = " ".join(str(e).split())[:200]
        if not wrapped:
            continue
        plain, names = make(wrapper="model"), list(wrapped)
        bases: list[float] = []
        added: dict[str, list[float]] = {w: [] for w in names}
        for r in range(rounds):
            bases.append(one(plain))
            # each round starts its wrappers at another: none is always the one timed furthest from the base
            for w in names[r % len(names) :] + names[: r % len(names)]:
                added[w].append(one(wrapped[w]) - bases[-1])
        base = statistics.median(bases)
        out.append(BlockPoint(knob="model", value=str(layers), rows=rows, seconds=base))
        out += [
            BlockPoint(knob=w, value=str(layers), rows=rows, seconds=max(base + statistics.median(extra), 1e-9))
            for w, extra in added.items()
        ]
    return out


def measure_blocks(
    shape: ModelShape,
    values: dict[str, tuple[str, ...]],
    *,
    rows: int,
    precision: str,
    timer: Timer,
    progress: Progress,
) -> tuple[list[BlockPoint], dict[str, str]]:
    """The block at the base settings and at each other knob value; returns the points and, per
    setting left out, why (a kernel this device cannot run, a compiler that fails)."""
    points, skipped = [], {}
    steady = Timer(timer.device, budget_s=max(timer.budget_s, 0.03), batches=5)  # the differences matter here
    settings_list = block_settings(values)
    for knob, value, settings in settings_list + settings_list[:1]:  # the base again last: the lower of two
        progress(f"block {knob}={value}")
        try:
            seconds = time_block(shape, settings, rows=rows, precision=precision, timer=steady)
        except Exception as e:  # noqa: BLE001 - a setting this device cannot run is left out, with why
            skipped[f"{knob}={value}"] = " ".join(str(e).split())[:200]
            continue
        points.append(BlockPoint(knob=knob, value=value, rows=rows, seconds=seconds))
    bases = [p for p in points if p.knob == "base"]
    if len(bases) == 2:
        points.remove(max(bases, key=lambda p: p.seconds))
    return points, skipped
