"""How far a distributed layout may end from its single-process reference: bounds measured, in the
same test run and on the same CPU, from float32 rounding itself (the noise floor).

Why no fixed number does. A layout computes the reference's sums in another order (a
micro-batch's rows, a tensor-parallel rank's columns, a data-parallel mean formed as a sum of
halves), so it matches the reference to rounding only. AdamW then turns rounding into steps:
where a gradient is below its eps (1e-8), the update is about lr * g / eps, so a rounding error
of 3e-10 in such a gradient moves the parameter by 1e-4 (lr 3e-3). About 3% of the tiny models'
gradients are that small (GPT's key biases are exactly zero in exact arithmetic: softmax ignores
a per-query constant), and the largest final differences sit on such elements: in GPT's
last fc2 a gradient of -1.00e-9 in float64 is -1.34e-9 in float32, and the run ends 8e-5 (after
2 steps) to 2e-4 (after 10) from the float64 run; LLaMA 6e-5. Which order MKL and ATen sum in
depends on the CPU (AVX2, AVX-512 and AMX kernels block and vectorise differently), so a fixed
bound that one CPU passes another fails: 1e-4 on the parameters after 10 steps failed the cp GPT
layouts on a CPU with AMX (1.06e-4, 1.25e-4) and passed them here (0.7e-4, 0.5e-4). Run in
float64, those layouts reproduce the float64 reference to 6e-14 after 10 steps: they compute
the same thing, and the rest is rounding.

The noise floor. The reference (`REFERENCE`: the whole batch in one micro-batch, float32) is
run again with only its arithmetic changed (`VARIANTS`): its rows in reverse order; the batch
in 4 micro-batches whose gradients accumulate as the trainer's do; in float64 (but for what the
model computes in float32 on purpose: norms, RoPE, the loss). The floor of a metric is the
largest difference between one of them and the reference, and at least one float32 ulp of the
values compared (a variant may round exactly as the reference does):

- loss: the largest difference over the steps (ulp of the largest loss);
- step-0 gradients: each tensor's largest difference (ulp of the tensor's largest gradient);
- parameters after the steps: the largest difference over every element (ulp of the largest).

A layout passes when each of its differences is at most `FACTOR` x that metric's floor.
`FACTOR` is 4: over the 62 parity cases after 2 and 3 steps, with the CPU's own kernels
(AVX-512) and with AVX2's (helpers.KERNELS: MKL's and ATen's), and the 53 of test_parity,
test_parity_families and test_cp_ep_trainer after 10 steps, the largest difference measured was
2.15 x its floor. A defect lands far above: a gradient scaled by 2, or left out of an
all-reduce, or the cp ranks' key/value gradients not summed, or GPT's positions taken from the
wrong rows under cp, moves a step-0 gradient by 3e3 to 2e6 x its bound; a parameter that misses
one update ends ~20 x its bound away (tests/runtime/test_bounds.py plants such defects). Floors
measured: loss 6e-7 to 1e-6, parameters 8e-7 (tiny MoE) to 1.9e-4 (tied GPT), gradients up to
7e-7 of the model's largest.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

FACTOR = 4.0
# The most a floor may be and still be rounding (see `_assert_rounding_only`): loss, parameters
# (a third of one AdamW update at lr 3e-3), a gradient as a fraction of the model's largest
MAX_FLOOR = {"loss": 1e-5, "params": 1e-3, "grads": 1e-5}
# A run: {"losses": [float per step], "grads": {name: step-0 gradient}, "params": {name: final value}}
Run = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Variant:
    """The arithmetic of a single-process run: the global batch in `micro_batches`, its rows
    reversed or not, in `dtype`."""

    micro_batches: int = 1
    reverse: bool = False
    dtype: torch.dtype = torch.float32


REFERENCE = Variant()
VARIANTS = (Variant(reverse=True), Variant(micro_batches=4), Variant(dtype=torch.float64))


@dataclasses.dataclass(frozen=True)
class Drift:
    """How far one run is from another: the largest loss difference over the steps, each step-0
    gradient's largest difference (by parameter name), the largest final parameter difference."""

    loss: float
    grads: dict[str, float]
    params: float

    def scaled(self, factor: float) -> Drift:
        return Drift(self.loss * factor, {k: v * factor for k, v in self.grads.items()}, self.params * factor)

    def worst_ratio(self, floor: Drift) -> float:
        """The largest of this drift's metrics as a multiple of `floor`'s."""
        ratios = [self.loss / floor.loss, self.params / floor.params]
        return max(ratios + [g / floor.grads[k] for k, g in self.grads.items()])


@dataclasses.dataclass(frozen=True)
class Reference:
    """The single-process run a layout must reproduce, and its noise floor."""

    run: Run
    floor: Drift


def drift(got: Run, ref: Run) -> Drift:
    """`got`'s differences from `ref` (as float32: a float64 run is compared at float32 precision)."""
    assert len(got["losses"]) == len(ref["losses"]), f"{len(got['losses'])} steps, the reference {len(ref['losses'])}"
    assert set(got["grads"]) == set(ref["grads"]), f"gradients differ: {sorted(set(got['grads']) ^ set(ref['grads']))}"
    assert set(got["params"]) == set(ref["params"]), (
        f"parameters differ: {sorted(set(got['params']) ^ set(ref['params']))}"
    )

    def diff(a: torch.Tensor, b: torch.Tensor) -> float:
        return (a.double() - b.double()).abs().max().item()

    return Drift(
        loss=max(abs(a - b) for a, b in zip(got["losses"], ref["losses"], strict=True)),
        grads={k: diff(got["grads"][k], g) for k, g in ref["grads"].items()},
        params=max(diff(got["params"][k], p) for k, p in ref["params"].items()),
    )


def _ulp(x: float) -> float:
    return float(torch.finfo(torch.float32).eps) * abs(x)


def noise_floor(ref: Run, variants: Sequence[Run]) -> Drift:
    """The largest drift of the variants from the reference, each metric at least one float32 ulp
    of the values it compares."""
    drifts = [drift(v, ref) for v in variants]
    top_param = max(p.abs().max().item() for p in ref["params"].values())
    return Drift(
        loss=max([_ulp(max(map(abs, ref["losses"])))] + [d.loss for d in drifts]),
        grads={k: max([_ulp(g.abs().max().item())] + [d.grads[k] for d in drifts]) for k, g in ref["grads"].items()},
        params=max([_ulp(top_param)] + [d.params for d in drifts]),
    )


def measure(run: Callable[[Variant], Run]) -> Reference:
    """`run` as the reference, and its noise floor from the variants, on one thread."""
    with one_thread():
        ref = run(REFERENCE)
        floor = noise_floor(ref, [run(v) for v in VARIANTS])
    _assert_rounding_only(floor, ref)
    return Reference(ref, floor)


def _assert_rounding_only(floor: Drift, ref: Run) -> None:
    """A floor far above rounding (the variants disagree: a token routed to another expert, a
    kernel that is not deterministic) would let any layout pass; refuse it. The caps are 5 to 15
    times the widest floor seen (loss 1.4e-6, parameters 1.9e-4, a gradient 6.6e-7 of the largest)."""
    top_grad = max(g.abs().max().item() for g in ref["grads"].values())
    assert floor.loss <= MAX_FLOOR["loss"], f"the reference's variants differ in loss by {floor.loss:.1e}"
    assert floor.params <= MAX_FLOOR["params"], f"the reference's variants differ in parameters by {floor.params:.1e}"
    worst = max(floor.grads, key=lambda k: floor.grads[k])
    assert floor.grads[worst] <= MAX_FLOOR["grads"] * top_grad, (
        f"the reference's variants differ in the step-0 gradient of {worst} by {floor.grads[worst]:.1e}"
    )


def assert_within(case_id: str, got: Run, ref: Reference) -> Drift:
    """Fail on the first metric of `got` beyond FACTOR x the reference's floor (step-0 gradients,
    then losses, then parameters); return its drift."""
    d, bound = drift(got, ref.run), ref.floor.scaled(FACTOR)
    for name, g in d.grads.items():  # the first evidence of a defect: later steps inherit it
        allowed = bound.grads[name]
        assert g <= allowed, f"{case_id}: step-0 gradient of {name} differs by {g:.2e} (bound {allowed:.2e})"
    assert d.loss <= bound.loss, f"{case_id}: loss differs by {d.loss:.2e} (bound {bound.loss:.2e})"
    steps = len(ref.run["losses"])
    assert d.params <= bound.params, (
        f"{case_id}: parameters after {steps} steps differ by {d.params:.2e} (bound {bound.params:.2e})"
    )
    print(
        f"{case_id}: dloss={d.loss:.1e} dparam={d.params:.1e} (floor {ref.floor.params:.1e});"
        f" worst {d.worst_ratio(ref.floor):.2f} x floor"
    )
    return d


def batches(x: torch.Tensor, y: torch.Tensor, variant: Variant) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The global batch (inputs, labels) as the variant's micro-batches."""
    if variant.reverse:
        x, y = x.flip(0), y.flip(0)
    n = variant.micro_batches
    return list(zip(x.chunk(n), y.chunk(n), strict=True))


def train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro: list[tuple[torch.Tensor, torch.Tensor]],
    steps: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    sync: Callable[[nn.Module, torch.Tensor], float] | None = None,
    name: Callable[[str], str] = str,
) -> Run:
    """`steps` optimizer steps, the micro-batches' gradients accumulated (each loss divided by
    their number, as the trainer does); `sync(model, loss)` (the ranks' runs) averages gradients
    and returns the global loss. Parameters and gradients by `name(parameter name)`."""
    losses, grads = [], {}
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        parts = []
        for xs, ys in micro:
            loss = loss_fn(model(xs), ys) / len(micro)
            loss.backward()
            parts.append(loss.detach())
        total = torch.stack(parts).sum()
        losses.append(sync(model, total) if sync else total.item())
        if step == 0:
            grads = {name(k): p.grad.clone() for k, p in model.named_parameters()}
        optimizer.step()
    return {
        "losses": losses,
        "grads": grads,
        "params": {name(k): p.detach().clone() for k, p in model.named_parameters()},
    }


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread: the single-process runs are tiny, and two OpenMP threads on a busy
    2-core machine spin for ~10 s a run instead of ~0.3 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
