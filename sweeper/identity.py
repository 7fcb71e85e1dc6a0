"""The identity of a sweep: a short hash of everything that changes its results.

Stored in every result row, so rows of two different experiments (another seq_len, another
model, a copied Parquet file of another sweep) are never mixed into one dataset, even when the
copy of the sweep file beside the results is gone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from sweeper.hardware import GPU
from sweeper.spec import Sweep
from sweeper.trainers import memory_record


def _plain(value: Any) -> Any:
    """Dataclasses, pydantic models and tuples as JSON-able plain data (deterministic order); a
    GPU without the fields that are the throughput model's assumptions (GPU.MODEL_FIELDS)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        skip = value.MODEL_FIELDS if isinstance(value, GPU) else ()
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in skip}
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def sweep_identity(sweep: Sweep) -> str:
    """16 hex digits over name, model, seq_len, batch, cluster, space, trial, memory and workload
    settings: not the budget, sampler, launcher or paths, which change how, not what, is measured."""
    what = {
        "name": sweep.name,
        "model": sweep.model,
        "seq_len": sweep.seq_len,
        "global_batch_size": sweep.global_batch_size,
        "cluster": sweep.cluster,
        "space": sweep.space,
        "trial": sweep.trial,
        "memory": memory_record(sweep.memory),  # flat over the recipes' options, as before they were split
        "workload": sweep.workload,
    }
    text = json.dumps(_plain(what), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
