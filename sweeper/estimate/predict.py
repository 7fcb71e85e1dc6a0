"""The step time of layouts on the sweep's cluster: priced from its measured profile where it has one
(`sweeper.estimate.profiled`), else from the GPU table (`sweeper.estimate.step_time`).

Every stage above the models asks here; the two pricings share their parts (`step_time.PARTS`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sweeper.estimate.profiled import predict_measured
from sweeper.estimate.step_time import Calibration, StepTime, predict_table
from sweeper.spec.traits import TimeTraits

if TYPE_CHECKING:
    from sweeper.knobs import Columns
    from sweeper.spec.sweep import Sweep


UNCALIBRATED = Calibration()  # the model's own scales


def predict(
    cols: Columns, sweep: Sweep, calibration: Calibration = UNCALIBRATED, traits: TimeTraits | None = None
) -> StepTime:
    """Step time by part and MFU for every layout in `cols` (derived columns included); `traits`
    default to the sweep's trainer's (`sweep.trainer.time`). With a profile on the sweep's cluster
    (`cluster.profile`) the profile prices the step, else the GPU table (`predict_table`)."""
    traits = traits if traits is not None else sweep.trainer.time
    if sweep.cluster.profile is not None:
        return predict_measured(sweep.cluster.profile, cols, sweep, calibration, traits)
    return predict_table(cols, sweep, calibration, traits)


def breakdown(
    cols: Columns, sweep: Sweep, calibration: Calibration = UNCALIBRATED, traits: TimeTraits | None = None
) -> dict[str, np.ndarray]:
    """Seconds per step by part, for every layout: `predict`'s parts with the calibration applied,
    and `forward` (the first forward pass's matmuls and attention, a third of fwd + bwd, for shares).

    Every part but `dp_hidden` (overlapped, so not on the step's critical path) is exposed, and
    the exposed parts add up to `predict(...).total` exactly: one model, read twice.
    """
    pred = predict(cols, sweep, calibration, traits)
    out = pred.calibrated_parts()
    out["forward"] = (out["matmul"] + out["attention"]) / 3.0
    return out
