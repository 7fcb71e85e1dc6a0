"""The parity bounds (tests/runtime/bounds.py) pass a run that differs from the reference only in
reduction order, and fail the defects a layout can have: a gradient scaled by 2, a gradient
left out of the data-parallel all-reduce, a parameter that misses one update. Planted in one
process on the GPT model, whose floors are among the widest (a LLaMA's bound is tighter). A
floor that is not rounding (variants that disagree) is refused rather than used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from sweeper.runtime.model import loss_fn
from sweeper.runtime.train import make_optimizer, synthetic_batch

from .bounds import FACTOR, Variant, assert_within, batches, drift, measure, one_thread, train
from .helpers import CPU, STEPS, plain_model, reference, tiny_sweep

MODEL = "gpt"
VICTIM = "layers.1.mlp.ffn.fc1.weight"


class SkipsOneUpdate:
    """The optimizer, except that `param` keeps its value through step `at` (a ZeRO-1 shard whose
    update is not broadcast back, an FSDP shard not written back)."""

    def __init__(self, inner: torch.optim.Optimizer, param: torch.nn.Parameter, at: int) -> None:
        self.inner, self.param, self.at, self.steps = inner, param, at, 0

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        before = self.param.detach().clone()
        self.inner.step()
        if self.steps == self.at:
            self.param.copy_(before)
        self.steps += 1


def _run(variant: Variant, tamper: Callable[[torch.nn.Module, Any], Any] | None = None) -> dict[str, Any]:
    """The reference's training run in `variant`'s arithmetic, with `tamper(model, optimizer)` applied first."""
    sweep = tiny_sweep(1, model=MODEL)
    net = plain_model(sweep).to(variant.dtype)
    opt: Any = make_optimizer(list(net.parameters()), lr=sweep.trial.lr, device=CPU)
    if tamper is not None:
        opt = tamper(net, opt) or opt
    x, y = synthetic_batch(sweep.model, batch=sweep.global_batch_size, seq_len=sweep.seq_len, seed=sweep.trial.seed)
    with one_thread():
        return train(net, opt, batches(x, y, variant), STEPS, loss_fn)


def _doubled(net: torch.nn.Module, opt: Any) -> None:
    net.get_parameter(VICTIM).register_hook(lambda g: g * 2)


def _first_half_only(net: torch.nn.Module, opt: Any) -> None:
    """With 2 micro-batches: the victim's gradient from the first half of the rows, counted
    twice, as a data-parallel rank that never all-reduced it would hold."""
    calls = [0]

    def hook(g: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return g * (2 if calls[0] % 2 == 1 else 0)

    net.get_parameter(VICTIM).register_hook(hook)


def _skips_update(net: torch.nn.Module, opt: Any) -> SkipsOneUpdate:
    return SkipsOneUpdate(opt, net.get_parameter(VICTIM), at=0)


@pytest.mark.parametrize("micro_batches", [2, 8])
def test_another_reduction_order_is_within_the_bounds(micro_batches: int) -> None:
    # neither is one of the variants the floor is measured from
    assert_within(f"{micro_batches} micro-batches", _run(Variant(micro_batches=micro_batches)), reference(model=MODEL))


@pytest.mark.parametrize(
    ("defect", "tamper", "micro_batches", "fails_on"),
    [
        ("gradient x 2", _doubled, 1, f"step-0 gradient of {VICTIM}"),
        ("no all-reduce", _first_half_only, 2, f"step-0 gradient of {VICTIM}"),
        # the next step's loss already shows it, and the parameter stays one update (~lr) behind
        ("update skipped", _skips_update, 1, f"loss differs|parameters after {STEPS} steps"),
    ],
)
def test_a_defect_is_far_beyond_the_bounds(
    defect: str, tamper: Callable[..., Any], micro_batches: int, fails_on: str
) -> None:
    ref = reference(model=MODEL)
    got = _run(Variant(micro_batches=micro_batches), tamper)
    with pytest.raises(AssertionError, match=fails_on):
        assert_within(defect, got, ref)
    # not by a hair: the defect's drift is many bounds away
    d = drift(got, ref.run)
    metric = d.params / ref.floor.params if "parameters" in fails_on else d.grads[VICTIM] / ref.floor.grads[VICTIM]
    print(f"{defect}: {metric:.0f} x the floor")
    assert metric > 10 * FACTOR, f"{defect}: only {metric:.1f} x the floor"


def test_a_floor_beyond_rounding_is_refused() -> None:
    # the float64 variant misses an update: the variants disagree by an lr-sized step
    def run(variant: Variant) -> dict[str, Any]:
        return _run(variant, _skips_update if variant.dtype == torch.float64 else None)

    with pytest.raises(AssertionError, match="the reference's variants differ in"):
        measure(run)
