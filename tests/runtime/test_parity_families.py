"""GPT blocks, a head_dim other than hidden/heads, and uneven pipeline stages reproduce the single-process reference.

Same protocol and bounds as test_parity.py (`STEPS` fp32 steps; loss, step-0 gradients,
parameters after the steps, each within 4 x its noise floor: tests/runtime/bounds.py). Models:
helpers.MODELS ("gpt": LayerNorm with biases, GELU MLP, biased projections, learned positions;
"head_dim": 4 heads of 32 on hidden 64; "layers5"/"layers7": layer counts that 2 stages, or 2x2
virtual stages, do not divide: stages.split_layers gives (2, 3) and (1, 2, 2, 2)). The GPT
models' floors are the widest (a single-process fp32 GPT run ends ~2e-4 from its fp64 run, a
LLaMA one ~6e-5), measured, not assumed; a wrong bias, position row or stage boundary moves the
loss and the gradients by orders of magnitude more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sweeper.layouts.stages import split_layers

from .test_parity import _check

TWO_RANKS: dict[str, tuple[dict[str, Any], bool, str]] = {
    "gpt_tp2_sp": ({"tp": 2, "sequence_parallel": True, "micro_batch_size": 4}, False, "gpt"),
    "gpt_tp2_fused_layernorm": ({"tp": 2, "rmsnorm": "fused", "micro_batch_size": 4}, False, "gpt"),
    "gpt_tp2_sp_selective_ac": (
        {"tp": 2, "sequence_parallel": True, "activation_checkpointing": "selective", "micro_batch_size": 4},
        False,
        "gpt",
    ),
    "gpt_tp2_eager_full_ac": (
        {"tp": 2, "attention": "eager", "activation_checkpointing": "full", "micro_batch_size": 4},
        False,
        "gpt",
    ),
    "gpt_pp2_ffn_ac": ({"pp": 2, "activation_checkpointing": "ffn", "micro_batch_size": 2}, False, "gpt"),
    "gpt_dp2_fsdp": ({"sharding": "fsdp", "micro_batch_size": 2}, False, "gpt"),
    "gpt_tied_pp2": ({"pp": 2, "micro_batch_size": 4}, True, "gpt"),
    "head_dim_tp2_sp": ({"tp": 2, "sequence_parallel": True, "micro_batch_size": 4}, False, "head_dim"),
    "head_dim_pp2": ({"pp": 2, "micro_batch_size": 2}, False, "head_dim"),
    "head_dim_dp2_fsdp_selective_ac": (
        {"sharding": "fsdp", "activation_checkpointing": "selective", "micro_batch_size": 2},
        False,
        "head_dim",
    ),
    "uneven5_pp2_1f1b": ({"pp": 2, "micro_batch_size": 2}, False, "layers5"),
    "uneven5_pp2_gpipe": ({"pp": 2, "pp_schedule": "gpipe", "micro_batch_size": 2}, False, "layers5"),
    "uneven7_pp2_interleaved": (
        {"pp": 2, "pp_schedule": "interleaved", "virtual_stages": 2, "micro_batch_size": 2},
        False,
        "layers7",
    ),
    "gpt_uneven5_pp2": ({"pp": 2, "micro_batch_size": 2}, False, "gpt_layers5"),
}
# every parallelism at once: dp2 (FSDP) x pp2 x tp2 with sequence parallelism
EIGHT_RANKS: dict[str, tuple[dict[str, Any], bool, str]] = {
    f"{model}_dp2_pp2_tp2_sp_fsdp": (
        {"tp": 2, "pp": 2, "sequence_parallel": True, "sharding": "fsdp", "micro_batch_size": 2},
        False,
        model,
    )
    for model in ("gpt", "head_dim")
}


def test_the_uneven_cases_really_are_uneven() -> None:
    assert split_layers(5, 2) == (2, 3)
    assert split_layers(7, 4) == (1, 2, 2, 2)


@pytest.mark.slow
@pytest.mark.parametrize("case_id", list(TWO_RANKS))
def test_two_ranks_match_single_process(two_ranks_parity: Path, case_id: str) -> None:
    _check(two_ranks_parity, case_id, *TWO_RANKS[case_id])


@pytest.mark.slow
def test_eight_ranks_gpt_and_head_dim_match_single_process(eight_ranks_parity: Path) -> None:
    for case_id, case in EIGHT_RANKS.items():
        _check(eight_ranks_parity, case_id, *case)


COMPILED: dict[str, tuple[dict[str, Any], bool, str]] = {
    "gpt_tp2_sp_compile": ({"tp": 2, "sequence_parallel": True, "compile": True, "micro_batch_size": 4}, False, "gpt"),
}


@pytest.mark.slow
def test_compiled_gpt_blocks_under_tp_match_single_process(two_ranks_parity: Path) -> None:
    _check(two_ranks_parity, "gpt_tp2_sp_compile", *COMPILED["gpt_tp2_sp_compile"])
