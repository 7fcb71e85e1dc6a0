"""The sweep file: its schema (`schema`), reading it (`loader`) and its error messages (`messages`).

Everything public is re-exported here, so `from sweeper.spec import Sweep, parse_sweep` works
everywhere. Modules below the loader (the layout rules, the memory model, the trainers) import
`sweeper.spec.schema` itself: the loader checks a sweep against the layout rules, so importing
this package from them would be an import cycle.
"""

from __future__ import annotations

from sweeper.spec.loader import (
    MAX_SPEC_BYTES,
    build_sweep,
    find_sweep_file,
    load_sweep,
    parse_sweep,
    shipped_spaces_dir,
)
from sweeper.spec.messages import format_validation_error
from sweeper.spec.schema import (
    ENV_NAME,
    MAX_LAYOUTS,
    SAFE_NAME,
    Cluster,
    ClusterSpec,
    GPUSpec,
    MemorySettings,
    ModelSpec,
    SearchSettings,
    SpaceSpec,
    Sweep,
    SweepFile,
    TrialSettings,
    WorkloadSpec,
)
from sweeper.trainers.base import STATE_PARTS, StateBytes

__all__ = [
    "ENV_NAME",
    "MAX_LAYOUTS",
    "MAX_SPEC_BYTES",
    "SAFE_NAME",
    "STATE_PARTS",
    "Cluster",
    "ClusterSpec",
    "GPUSpec",
    "MemorySettings",
    "ModelSpec",
    "SearchSettings",
    "SpaceSpec",
    "StateBytes",
    "Sweep",
    "SweepFile",
    "TrialSettings",
    "WorkloadSpec",
    "build_sweep",
    "find_sweep_file",
    "format_validation_error",
    "load_sweep",
    "parse_sweep",
    "shipped_spaces_dir",
]
