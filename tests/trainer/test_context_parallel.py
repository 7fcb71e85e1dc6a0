"""Context parallelism (sweeper.trainer.context): the load-balanced split, and the tiny LLaMA trained
with its sequence split over cp=2 gloo ranks reproducing the single-process reference.

Tolerances as the dense parity tests (tests/trainer/test_parity.py): loss 1e-6, step-0 gradients
1e-8 absolute or 1e-6 of the tensor's largest, parameters after 10 AdamW steps 1e-4. The
reference runs the flash2 kernel with is_causal over the whole sequence; the cp ranks run SDPA
with an explicit mask over the gathered keys (another kernel), so equality is to rounding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from sweeper.trainer.context import chunk_ids, local_positions, shard_sequence

from .cp_ep_workers import TINY_GPT, TINY_MOE, model_case, model_reference, parity_diffs
from .helpers import max_diff, reference

LOSS_TOL, GRAD_TOL, GRAD_RTOL, PARAM_TOL = 1e-6, 1e-8, 1e-6, 1e-4
STEPS = 10

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
    ref = reference()
    got = cp2
    assert isinstance(got["losses"], list) and len(got["losses"]) == STEPS
    dloss = max(abs(a - b) for a, b in zip(got["losses"], ref["losses"]))
    assert dloss <= LOSS_TOL, f"loss differs by {dloss:.2e}"
    grads = got["grads"]
    assert isinstance(grads, dict)
    for name, g in ref["grads"].items():
        diff = (grads[name] - g).abs().max().item()
        allowed = max(GRAD_TOL, GRAD_RTOL * g.abs().max().item())
        assert diff <= allowed, f"step-0 gradient of {name} differs by {diff:.2e} (allowed {allowed:.1e})"
    params = got["params"]
    assert isinstance(params, dict)
    dparam = max_diff(params, ref["params"])
    assert dparam <= PARAM_TOL, f"parameters after {STEPS} steps differ by {dparam:.2e}"
    print(f"cp2: dloss={dloss:.1e} dgrad={max_diff(grads, ref['grads']):.1e} dparam={dparam:.1e}")


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(MODEL_CASES))
def test_built_in_model_with_cp2_matches_single_process(cp2: dict[str, Any], case_id: str) -> None:
    case = MODEL_CASES[case_id]
    ref = model_reference(case)
    dloss, dgrad, dparam = parity_diffs(
        cp2["model_cases"][case_id], ref, case["ep"], grad_tol=GRAD_TOL, grad_rtol=GRAD_RTOL
    )
    assert dloss <= LOSS_TOL, f"{case_id}: loss differs by {dloss:.2e}"
    assert dparam <= PARAM_TOL, f"{case_id}: parameters after {case['steps']} steps differ by {dparam:.2e}"
    print(f"{case_id}: dloss={dloss:.1e} dgrad={dgrad:.1e} dparam={dparam:.1e}")
