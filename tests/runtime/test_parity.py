"""Every layout family trains `STEPS` (2) steps and reproduces the single-process reference (same init, fp32).

Each world size is one launch that runs its layouts one after another (start-up costs seconds;
the 2-rank one also runs the other parity modules' cases, conftest `two_rank_launch`), its ranks with
AVX2's kernels (MKL's and ATen's, helpers.KERNELS) against a reference with the CPU's own.
Compared with the reference: the loss of every step, every step-0 gradient, every parameter after
the steps. The bounds are not fixed numbers but 4 x the noise floor of float32 rounding, measured
in the same run on the same CPU (tests/runtime/bounds.py says how, and why a fixed bound failed
on another CPU): for each metric, the largest difference between the reference and the same
single-process run with its rows reversed, in 4 micro-batches, or in float64.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .bounds import assert_within
from .helpers import KERNELS, STEPS, merged, reference, run_workers, tiny_sweep

# id -> (knobs, tied embeddings); micro-batch sizes keep 2 micro-batches per step where they can
TWO_RANKS: dict[str, tuple[dict[str, Any], bool]] = {
    "tp2": ({"tp": 2, "micro_batch_size": 4}, False),
    "tp2_sp": ({"tp": 2, "sequence_parallel": True, "micro_batch_size": 4}, False),
    "tp2_sp_fused_rmsnorm": ({"tp": 2, "sequence_parallel": True, "rmsnorm": "fused", "micro_batch_size": 4}, False),
    "tp2_eager_attention": ({"tp": 2, "attention": "eager", "micro_batch_size": 4}, False),
    "tp2_sdpa_math": ({"tp": 2, "attention": "sdpa_math", "micro_batch_size": 4}, False),
    "tp2_sp_selective_ac": (
        {"tp": 2, "sequence_parallel": True, "activation_checkpointing": "selective", "micro_batch_size": 4},
        False,
    ),
    "pp2_1f1b": ({"pp": 2, "micro_batch_size": 2}, False),
    "pp2_gpipe": ({"pp": 2, "pp_schedule": "gpipe", "micro_batch_size": 2}, False),
    # one micro-batch on two stages: torch's Schedule1F1B refuses it, the trainer runs GPipe's order
    "pp2_1f1b_one_microbatch": ({"pp": 2, "micro_batch_size": 8}, False),
    "pp2_interleaved": ({"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "micro_batch_size": 2}, False),
    "pp2_ffn_ac": ({"pp": 2, "activation_checkpointing": "ffn", "micro_batch_size": 4}, False),
    "dp2_fsdp": ({"sharding": "fsdp", "micro_batch_size": 2}, False),
    "dp2_fsdp_full_ac": ({"sharding": "fsdp", "activation_checkpointing": "full", "micro_batch_size": 2}, False),
    "dp2_ddp": ({"sharding": "none", "micro_batch_size": 2}, False),
    "dp2_zero1": ({"sharding": "zero1", "micro_batch_size": 2}, False),
    "tied_tp2": ({"tp": 2, "micro_batch_size": 4}, True),
    "tied_pp2": ({"pp": 2, "micro_batch_size": 4}, True),
}
FOUR_RANKS: dict[str, tuple[Any, ...]] = {
    "dp2_tp2_sp_fsdp": ({"tp": 2, "sequence_parallel": True, "sharding": "fsdp", "micro_batch_size": 2}, False),
    "dp2_tp2_replicate": ({"tp": 2, "sharding": "none", "micro_batch_size": 2}, False),
    "dp2_tp2_zero1": ({"tp": 2, "sharding": "zero1", "micro_batch_size": 2}, False),
    "pp2_tp2_sp": ({"tp": 2, "pp": 2, "sequence_parallel": True, "micro_batch_size": 4}, False),
    "pp2_tp2_interleaved": (
        {"tp": 2, "pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "micro_batch_size": 4},
        False,
    ),
    "dp2_pp2_fsdp": ({"pp": 2, "sharding": "fsdp", "micro_batch_size": 2}, False),
    "dp2_pp2_replicate": ({"pp": 2, "sharding": "none", "micro_batch_size": 2}, False),
    "dp2_pp2_fsdp_tied": ({"pp": 2, "sharding": "fsdp", "micro_batch_size": 2}, True),
    # context parallel with the other splits (sweeper/runtime/context.py): dense weights replicated
    # over dp*cp, each cp rank its two chunks; GPT's learned positions under SP are summed over tp
    "pp2_cp2_tied": ({"pp": 2, "cp": 2, "micro_batch_size": 2}, True),
    "gpt_cp2_tp2_sp": ({"tp": 2, "cp": 2, "sequence_parallel": True, "micro_batch_size": 4}, False, "gpt"),
    # experts split over ep = dp = 2 inside each pipeline stage, left out of the replication
    "moe_pp2_ep2": ({"pp": 2, "ep": 2, "micro_batch_size": 2}, False, "moe"),
}
EIGHT_RANKS = {
    "dp2_pp2_tp2_sp_fsdp": (
        {"tp": 2, "pp": 2, "sequence_parallel": True, "sharding": "fsdp", "micro_batch_size": 2},
        False,
    ),
}
COMPILED = {
    "tp2_sp_compile": ({"tp": 2, "sequence_parallel": True, "compile": True, "micro_batch_size": 4}, False),
}


def specs(cases: dict[str, tuple[Any, ...]], world: int) -> list[dict[str, Any]]:
    """The cases as `workers.parity_cases` takes them: (knobs, tied) or (knobs, tied, model of helpers.MODELS)."""
    return [
        {"id": cid, "sweep": tiny_sweep(world, tied=c[1], model=c[2] if len(c) > 2 else "llama"), "knobs": c[0]}
        for cid, c in cases.items()
    ]


def _run(cases: dict[str, tuple[Any, ...]], world: int, workdir: Path, *, kernels: str, timeout_s: float = 400) -> Path:
    """One launch of `world` ranks training `cases` with the kernels of helpers.KERNELS[kernels]."""
    done = run_workers(
        "parity",
        nprocs=world,
        workdir=workdir,
        timeout_s=timeout_s,
        env=KERNELS[kernels],
        cases=specs(cases, world),
        steps=STEPS,
    )
    return done.out_dir


def _check(out_dir: Path, case_id: str, knobs: dict[str, Any], tied: bool, model: str = "llama") -> None:
    ref = reference(tied, knobs.get("attention", "flash2"), knobs.get("rmsnorm", "eager"), STEPS, model)
    assert_within(case_id, merged(out_dir, case_id), ref)


@pytest.fixture(scope="module", params=list(KERNELS))
def four_ranks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _run(FOUR_RANKS, 4, tmp_path_factory.mktemp("parity4"), kernels=request.param)


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(TWO_RANKS))
def test_two_ranks_match_single_process(two_ranks_parity: Path, case_id: str) -> None:
    _check(two_ranks_parity, case_id, *TWO_RANKS[case_id])


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(FOUR_RANKS))
def test_four_ranks_match_single_process(four_ranks: Path, case_id: str) -> None:
    _check(four_ranks, case_id, *FOUR_RANKS[case_id])


@pytest.mark.slow
def test_eight_ranks_dp_pp_tp_match_single_process(eight_ranks_parity: Path) -> None:
    _check(eight_ranks_parity, "dp2_pp2_tp2_sp_fsdp", *EIGHT_RANKS["dp2_pp2_tp2_sp_fsdp"])


@pytest.mark.slow
def test_compiled_blocks_under_tp_match_single_process(two_ranks_parity: Path) -> None:
    _check(two_ranks_parity, "tp2_sp_compile", *COMPILED["tp2_sp_compile"])
