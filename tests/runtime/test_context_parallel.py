"""Context parallelism (sweeper.runtime.context): the load-balanced split, and the tiny LLaMA trained
with its sequence split over cp=2 gloo ranks reproducing the single-process reference.

Bounds as the dense parity tests (tests/runtime/test_parity.py): loss, step-0 gradients and
parameters after the steps each within 4 x its noise floor (tests/runtime/bounds.py). The
reference runs the flash2 kernel with is_causal over the whole sequence; the cp ranks run SDPA
with an explicit mask over the gathered keys (another kernel), so equality is to rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sweeper.runtime.context import chunk_ids, local_positions, shard_sequence

from .bounds import assert_within
from .cp_ep_workers import TINY_GPT, TINY_MOE, merge_ranks, model_case, model_reference
from .helpers import reference

# the built-in Transformer: MoE layers with cp=2 (experts whole on each rank, or split over the
# cp ranks: ep=2 inside dp*cp=2), and GPT's learned positions with cp=2
MODEL_CASES = {
    "moe_cp2": model_case("moe_cp2", TINY_MOE, cp=2, ep=1),
    "moe_cp2_ep2": model_case("moe_cp2_ep2", TINY_MOE, cp=2, ep=2),
    "gpt_cp2": model_case("gpt_cp2", TINY_GPT, cp=2, ep=1),
}


def test_chunks_are_load_balanced() -> None:
    # cp=2, 16 tokens: 4 chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert chunk_ids(2, 0) == (0, 3) and chunk_ids(2, 1) == (1, 2)
    assert local_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert local_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    # every position held exactly once, and every rank has as many causal (query, key) pairs
    for cp in (2, 4):
        held = torch.cat([local_positions(64, cp, r) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(64))
        work = {int((local_positions(64, cp, r) + 1).sum()) for r in range(cp)}
        assert len(work) == 1


def test_shard_sequence_picks_the_positions() -> None:
    x = torch.arange(2 * 8).view(2, 8)
    assert shard_sequence(x, cp=2, rank=1).tolist() == [[2, 3, 4, 5], [10, 11, 12, 13]]


def test_sequence_not_divisible_by_two_cp_is_refused() -> None:
    with pytest.raises(ValueError, match="2\\*cp must divide seq_len"):
        local_positions(12, 4, 0)


@pytest.fixture(scope="module")
def cp2(cp_ep_parity: Path) -> dict[str, Any]:
    """What the session's 2-rank launch (conftest) saved for the context-parallel cases."""
    out: dict[str, Any] = torch.load(cp_ep_parity / "cp_rank0.pt")
    out["model_cases"] = {
        cid: [torch.load(cp_ep_parity / f"{cid}_rank{r}.pt") for r in range(2)] for cid in MODEL_CASES
    }
    return out


@pytest.mark.slow
def test_cp2_matches_single_process(cp2: dict[str, Any]) -> None:
    assert_within("cp2", cp2, reference())


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(MODEL_CASES))
def test_built_in_model_with_cp2_matches_single_process(cp2: dict[str, Any], case_id: str) -> None:
    case = MODEL_CASES[case_id]
    assert_within(case_id, merge_ranks(cp2["model_cases"][case_id], case["ep"]), model_reference(case))
