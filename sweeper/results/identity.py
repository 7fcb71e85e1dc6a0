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

from sweeper.knobs import KNOBS
from sweeper.spec.hardware import GPU
from sweeper.spec.models import ModelShape
from sweeper.spec.sweep import Cluster, Sweep
from sweeper.trainers import memory_record


def _plain(value: Any) -> Any:
    """Dataclasses, pydantic models and tuples as JSON-able plain data (deterministic order); a
    GPU without the fields that are the throughput model's assumptions (GPU.MODEL_FIELDS)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        skip = _skipped(value)
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in skip}
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump())
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _skipped(value: Any) -> tuple[str, ...]:
    # a GPU's model assumptions, the cluster's profile, a dense model's (empty) mixture-of-experts fields and the unset
    # late fields (GPT-OSS's biases and sinks), which identities written before those fields existed did not hold
    if isinstance(value, GPU):
        return value.MODEL_FIELDS
    if isinstance(
        value, Cluster
    ):  # a profile (and the link it names) changes how the model prices, not what is measured
        return ("profile", "link")
    if isinstance(value, ModelShape):
        late = tuple(f for f in ModelShape.LATE_FIELDS if not getattr(value, f))
        return late + (ModelShape.MOE_FIELDS if not value.is_moe else ())
    return ()


def _space(space: dict[str, tuple[Any, ...]]) -> dict[str, tuple[Any, ...]]:
    """The space without the knobs that are not searched and joined the identity late (`Knob.identity_if_searched`)."""
    return {k: v for k, v in space.items() if not (KNOBS[k].identity_if_searched and v == (KNOBS[k].default,))}


def _memory(sweep: Sweep) -> dict[str, Any]:
    """`memory:` flat over the recipes' options, as before they were split, without the late
    options left unset (`MemoryOptions.LATE_FIELDS`), which identities written before them did not hold."""
    late = type(sweep.memory).LATE_FIELDS
    return {k: v for k, v in memory_record(sweep.memory).items() if not (k in late and v is None)}


def sweep_identity(sweep: Sweep) -> str:
    """16 hex digits over name, model, seq_len, batch, cluster, space, trial, memory and workload
    settings (and the node counts of a sweep over several): not the budget, sampler, launcher, goal or paths, which change how, not what, is measured."""
    what = {
        "name": sweep.name,
        "model": sweep.model,
        "seq_len": sweep.seq_len,
        "global_batch_size": sweep.global_batch_size,
        "cluster": sweep.cluster,
        "space": _space(sweep.space),
        "trial": sweep.trial,
        "memory": _memory(sweep),
        "workload": sweep.workload,
    }
    if sweep.several_sizes:  # a sweep of one size keeps the identity it had before node lists existed
        what["nodes"] = list(sweep.node_counts)
    text = json.dumps(_plain(what), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
