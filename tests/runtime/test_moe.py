"""The MoE block (sweeper.runtime.moe): routing and grouped experts against a per-token loop, and a
tiny MoE model trained with ep=2 on two gloo ranks reproducing the single-process run.

Parity (ep=2 against one process, 5 AdamW steps at lr 0.01): loss, step-0 gradients and
parameters after the steps each within 4 x its noise floor, measured in the same run
(tests/runtime/bounds.py). The routed tokens meet their experts in another order and the
data-parallel mean is formed as a sum of two halves, so equality is to float32 rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from sweeper.runtime.moe import MoE, Router, _regroup

from .bounds import assert_within
from .cp_ep_workers import (
    TINY_MOE,
    TinyMoE,
    init_tiny_moe,
    merge_ranks,
    model_case,
    model_reference,
    tiny_batch,
    tiny_moe_reference,
)

BASE = dict(vocab=64, hidden=32, moe_ffn=16, batch=4, seq=16, steps=5)
CASES: dict[str, dict[str, Any]] = {
    "top2_shared": BASE | dict(experts=4, top_k=2, shared=1, renormalize=True),
    "top3_of_8": BASE | dict(experts=8, top_k=3, shared=0, renormalize=False),
    # rank 1's experts receive no token: empty splits in both all-to-alls. Top-1 weighted by its
    # softmax score (Switch Transformer): renormalised, the weight is 1 and the router's gradient
    # exactly zero, and Adam would blow its rounding noise (3e-10) up into a routing flip
    "top1_skewed": BASE | dict(experts=4, top_k=1, shared=0, renormalize=False, skewed=True),
}

MODEL_EP2 = {
    "moe_ep2": model_case("moe_ep2", TINY_MOE, cp=1, ep=2),
    "moe_ep2_full_ac": model_case("moe_ep2_full_ac", TINY_MOE, cp=1, ep=2) | {"ac": "full"},
}


def _per_token_moe(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """The MoE's output computed token by token, expert by expert: the definition."""
    tokens = x.reshape(-1, x.shape[-1])
    weights, ids = moe.router(tokens)
    w1, w2, w3 = moe.experts.w1, moe.experts.w2, moe.experts.w3
    rows = []
    for t in range(tokens.shape[0]):
        acc = torch.zeros_like(tokens[t])
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            acc += weights[t, j] * (w2[e] @ (F.silu(w1[e] @ tokens[t]) * (w3[e] @ tokens[t])))
        rows.append(acc + (moe.shared(tokens[t : t + 1])[0] if moe.shared is not None else 0))
    return torch.stack(rows).view(x.shape)


def test_router_keeps_top_k_and_renormalises() -> None:
    torch.manual_seed(0)
    router = Router(8, 6, 2)
    x = torch.randn(5, 8)
    weights, ids = router(x)
    scores = torch.softmax(router.gate(x), dim=-1)
    assert torch.equal(ids, scores.topk(2, dim=-1).indices)
    torch.testing.assert_close(weights.sum(-1), torch.ones(5))
    plain = Router(8, 6, 2, renormalize=False)
    plain.load_state_dict(router.state_dict())
    torch.testing.assert_close(plain(x)[0], scores.topk(2, dim=-1).values)


def test_top_k_above_experts_is_refused() -> None:
    with pytest.raises(ValueError, match="experts_per_token=5"):
        Router(8, 4, 5)


@pytest.mark.parametrize("shared", [0, 2])
def test_grouped_experts_equal_the_per_token_definition(shared: int) -> None:
    torch.manual_seed(0)
    moe = MoE(hidden=16, experts=4, top_k=2, moe_ffn=8, shared_experts=shared)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(moe(x), _per_token_moe(moe, x), atol=1e-6, rtol=1e-5)


def test_regroup_orders_runs_by_expert_then_rank() -> None:
    # 2 ranks x 2 experts: rank 0 sent 1 row to e0 and 2 to e1, rank 1 sent 0 to e0 and 1 to e1
    counts = torch.tensor([[1, 2], [0, 1]])
    assert _regroup(counts).tolist() == [0, 1, 2, 3]  # e0: r0 row 0; e1: r0 rows 1-2, r1 row 3
    counts = torch.tensor([[2, 1], [1, 1]])
    assert _regroup(counts).tolist() == [0, 1, 3, 2, 4]


def test_skewed_case_routes_nothing_to_rank_1s_experts() -> None:
    case = CASES["top1_skewed"]
    model = TinyMoE(case)
    init_tiny_moe(model, case)
    _, ids = model.moe.router(model.tok_embeddings(tiny_batch(case)[0]).flatten(0, 1))
    assert torch.bincount(ids.flatten(), minlength=4).tolist()[2:] == [0, 0]


@pytest.fixture(scope="module")
def ep2(cp_ep_parity: Path) -> Path:
    return cp_ep_parity  # the session's 2-rank launch ran the expert-parallel cases (conftest)


@pytest.mark.slow
def test_experts_not_divisible_by_ep_are_refused(ep2: Path) -> None:
    assert (ep2 / "refused_rank0.txt").read_text() == "ep=2: must divide experts (3)"


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(CASES))
def test_ep2_matches_single_process(ep2: Path, case_id: str) -> None:
    ranks = [torch.load(ep2 / f"{case_id}_rank{r}.pt") for r in range(2)]
    assert_within(case_id, merge_ranks(ranks, 2), tiny_moe_reference(CASES[case_id]))


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(MODEL_EP2))
def test_built_in_model_with_ep2_matches_single_process(ep2: Path, case_id: str) -> None:
    """The built-in Transformer (a dense layer, then an MoE layer with a shared expert), data
    parallel over 2 ranks with its experts split over them (also under full checkpointing, whose
    recomputation repeats the all-to-alls in backward); 4 AdamW steps."""
    ranks = [torch.load(ep2 / f"{case_id}_rank{r}.pt") for r in range(2)]
    assert ranks[0]["params"]["layers.1.mlp.ffn.experts.w1"].shape[0] == 2  # 2 of the 4 experts each
    assert_within(case_id, merge_ranks(ranks, 2), model_reference(MODEL_EP2[case_id]))
