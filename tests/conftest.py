"""Shared fixtures: sweeps built from small dicts, and the path of the repository's spaces."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.spec import Sweep, parse_sweep

ROOT = Path(__file__).resolve().parents[1]
SPACES = ROOT / "search_spaces"


def base_spec(**overrides: Any) -> dict[str, Any]:
    """A valid LLaMA-13B sweep on 8 nodes of 8 A100-80GB, with fields replaced by `overrides`."""
    spec: dict[str, Any] = {
        "name": "t",
        "model": "llama-13b",
        "seq_len": 2048,
        "global_batch_size": 2048,
        "cluster": {"nodes": 8, "gpus_per_node": 8, "gpu": "a100-80gb"},
        "space": {"tp": [1, 2, 4, 8], "pp": [1, 2, 4], "micro_batch_size": [1, 2]},
    }
    spec.update(overrides)
    return spec


def make_sweep(**overrides: Any) -> Sweep:
    return parse_sweep(yaml.safe_dump(base_spec(**overrides)))


@pytest.fixture
def sweep13b() -> Sweep:
    return make_sweep()

# the session fixture `slurm_cluster` (a real single-node SLURM, root only)
pytest_plugins = ["tests.slurm_cluster"]
