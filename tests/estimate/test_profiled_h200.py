"""The profiled step-time model against real trials on one H200 (benchmarks/data/h200/, README there).

The profile was measured by `sweep profile` on that card before its trials ran, and no constant of
the model was chosen on these trials, so they are a check, not a fit. The GPU table's model is
beside it: on the same trials it predicts every step 20-35 % too short (the issue's +46 % MFU).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sweeper.estimate.predict import predict
from sweeper.layouts.layout import Layout
from sweeper.spec.loader import parse_sweep
from sweeper.spec.sweep import Sweep

DATA = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "h200"


def _sweep(*, profiled: bool) -> Sweep:
    text = (DATA / "sweep.yaml").read_text()
    if profiled:
        text = text.replace("gpu: h200", f"profile: {DATA / 'profile.yaml'}, gpu: h200")
    return parse_sweep(text, source=str(DATA / "sweep.yaml"), profiles=profiled)


def _trials() -> list[tuple[dict[str, object], float]]:
    out = []
    for row in csv.DictReader((DATA / "trials.csv").read_text().splitlines()):
        if row["status"] != "ok":
            continue
        knobs = {
            k: (v == "True" if v in ("True", "False") else int(v) if v.isdigit() else v)
            for k, v in (kv.split("=") for kv in row["layout"].split())
        }
        out.append((knobs, float(row["measured_s"])))
    return out


def _predicted(sweep: Sweep, knobs: dict[str, object]) -> float:
    layout = Layout.from_mapping({k: v[0] for k, v in sweep.space.items()} | knobs)
    return float(predict(layout.columns(sweep), sweep).total[0])


@pytest.fixture(scope="module")
def errors() -> pd.DataFrame:
    trials = _trials()
    assert len(trials) == 12
    profiled, table = _sweep(profiled=True), _sweep(profiled=False)
    assert profiled.cluster.profile is not None and table.cluster.profile is None
    return pd.DataFrame(
        [{"measured": m, "profiled": _predicted(profiled, k), "table": _predicted(table, k)} for k, m in trials]
    )


def test_the_profiled_model_meets_the_issues_goal_on_the_h200_trials(errors: pd.DataFrame) -> None:
    err = (errors.profiled / errors.measured - 1).abs()
    rho = errors.profiled.rank().corr(errors.measured.rank())
    # measured: 2.3 % median, 0.98; the issue's goal is <= 15 % (vTrain's 8.4-14.7 %)
    assert np.median(err) <= 0.05, f"median |error| {np.median(err):.1%}"
    assert rho >= 0.9, f"spearman {rho:.2f}"


def test_the_table_model_misses_the_same_trials_by_what_the_issue_reported(errors: pd.DataFrame) -> None:
    signed = errors.table / errors.measured - 1
    # every step predicted too short: the card's table figures promise more than the trainer reaches
    assert (signed < 0).all()
    assert 0.2 <= float(np.median(signed.abs())) <= 0.35
