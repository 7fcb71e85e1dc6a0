"""cp and ep layouts through the trainer's real setup (`build_trainer`: the pp x dp x cp x tp mesh,
the dp*cp data mesh, the expert mesh, DDP/FSDP/ZeRO-1, each rank's rows and sequence chunks,
`Trainer.step`) reproduce the single-process reference on two gloo ranks; and the cp attention
(each local chunk over its prefix with a lower-right causal bias) against plain causal attention.

Bounds as the dense parity tests (test_parity.py): loss, step-0 gradients and parameters after
the steps each within 4 x its noise floor, measured in the same run (tests/runtime/bounds.py).
The ranks run in the session's 2-rank launch (conftest `two_rank_launch`), with AVX2's kernels
against a reference with the CPU's own (helpers.KERNELS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend

from sweeper.runtime.context import cp_backend, prefix_attention
from sweeper.runtime.kernels import KernelUnavailable
from sweeper.spec.sweep import Sweep

from .bounds import assert_within
from .cp_ep_workers import merge_ranks
from .helpers import CPU, STEPS, reference, tiny_sweep

# id -> (knobs, model of helpers.MODELS), each trained STEPS steps; "moe": the tiny LLaMA with 3 MoE
# blocks after a dense one. cp=2 on 2 ranks: dp=1 and the dense weights averaged over the cp group
# (DDP, FSDP or ZeRO-1 over dp*cp); ep=2: dp=2, experts split.
TRAINER_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "trainer_cp2": ({"cp": 2, "micro_batch_size": 4}, "llama"),
    "trainer_cp2_fsdp_math": ({"cp": 2, "sharding": "fsdp", "attention": "sdpa_math", "micro_batch_size": 4}, "llama"),
    "trainer_cp2_gpt_zero1": ({"cp": 2, "sharding": "zero1", "micro_batch_size": 2}, "gpt"),
    "trainer_ep2": ({"ep": 2, "micro_batch_size": 2}, "moe"),
    "trainer_ep2_zero1": ({"ep": 2, "sharding": "zero1", "micro_batch_size": 2}, "moe"),
    "trainer_cp2_ep2": ({"cp": 2, "ep": 2, "micro_batch_size": 4}, "moe"),
    "trainer_moe_fsdp": ({"sharding": "fsdp", "micro_batch_size": 2}, "moe"),
}


def case_sweep(model: str, world: int) -> Sweep:
    return tiny_sweep(world, model=model)


def trainer_specs() -> list[dict[str, Any]]:
    """The cases as the worker takes them (conftest passes them to the 2-rank launch)."""
    return [
        {"id": cid, "sweep": case_sweep(model, 2), "knobs": knobs, "steps": STEPS}
        for cid, (knobs, model) in TRAINER_CASES.items()
    ]


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(TRAINER_CASES))
def test_trainer_cp_ep_layouts_match_single_process(cp_ep_parity: Path, case_id: str) -> None:
    knobs, model = TRAINER_CASES[case_id]
    ranks = [torch.load(cp_ep_parity / f"{case_id}_rank{r}.pt") for r in range(2)]
    if knobs.get("ep", 1) > 1:  # each rank holds 2 of the 4 experts
        assert ranks[0]["params"]["layers.1.mlp.ffn.experts.w1"].shape[0] == 2
    # the reference test_parity's cases share where they can (one cached run and floor)
    ref = reference(False, knobs.get("attention", "flash2"), "eager", STEPS, model)
    assert_within(case_id, merge_ranks(ranks, knobs.get("ep", 1)), ref)


@pytest.mark.parametrize("backend", [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION])
@pytest.mark.parametrize("gqa", [True, False])
def test_prefix_attention_is_the_causal_tail(backend: SDPBackend, gqa: bool) -> None:
    # a chunk of 8 queries at positions 16..23 over keys 0..23: the last 8 rows of causal attention
    torch.manual_seed(0)
    q = torch.randn(2, 4, 24, 16)
    k, v = torch.randn(2, 2, 24, 16), torch.randn(2, 2, 24, 16)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    got = prefix_attention(q[:, :, 16:], k, v, backend=backend, gqa=gqa)
    torch.testing.assert_close(got, full[:, :, 16:], atol=1e-6, rtol=1e-5)
    # the first chunk (as many queries as keys) is plain causal attention
    torch.testing.assert_close(
        prefix_attention(q[:, :, :8], k[:, :, :8], v[:, :, :8], backend=backend, gqa=gqa), full[:, :, :8]
    )


def test_cp_kernels_are_probed_and_refused_with_a_reason() -> None:
    shape = dict(batch=1, heads=4, kv_heads=2, head_dim=16, seq_len=32, cp=2, dtype=torch.float32, device=CPU)
    assert cp_backend("sdpa_math", **shape) == (SDPBackend.MATH, True)
    assert cp_backend("flash2", **shape)[0] == SDPBackend.FLASH_ATTENTION
    with pytest.raises(KernelUnavailable, match="attention=sdpa_efficient with cp = 2 .* cannot run on cpu"):
        cp_backend("sdpa_efficient", **shape)  # no memory-efficient kernel on CPU
    with pytest.raises(KernelUnavailable, match="runs SDPA kernels flash2, sdpa_efficient, sdpa_math only"):
        cp_backend("eager", **shape)
