"""The ultrascale sweep's pipeline stall, stated from the data (throughput_accuracy.py prints it).

At pp > 1 the measured seconds per micro-batch of the Ultra-Scale Playbook sweep (nanotron) are
bimodal: most runs take what their layout's work explains, some take ~1-1.5 s more on every
micro-batch whatever the model size, tp, pp or micro-batch (a stalled run's step is m x ~1.3 s on
64 nodes from 1B to 80B, whatever pp). The share of runs that stall grows with the nodes. Which
ZeRO-1 run stalls does not follow from its layout: at 4-16 nodes about the same share stalls at
every pp, tp, micro-batch size and model size, so the model can only price the share (ZeRO-0 runs
with dp > 1 and 16 or more micro-batches stall there most of the time, a mode not priced apart).
On 64 nodes pp = 1 runs stall too (most of them): not priced, the trait being a pipeline engine's.
Each of the sweep's numbers is a single early step (its third; ../shared/data/ultrascale/README.md,
"Measurement"), so whatever slows one step of a run is not averaged away.

A row stalled: its measured step exceeds the model's without the stall (`replace(traits,
pp_stall=None)`) by more than STALL_EXCESS_S per micro-batch; the excess per micro-batch of the
sweep's rows is itself bimodal, few pp > 1 rows lie between 0.3 and 0.5 s, and pp = 1 rows below
64 nodes exceed 0.5 s once in 273. `fit_stall` fits the share (a logistic in the node count, by
maximum likelihood) and the seconds (the stalled rows' median excess) on the FIT cells' pp > 1
rows only; `sweeper.trainers.nanotron.NANOTRON_TIME` carries the numbers it prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import pandas as pd
from scipy.optimize import minimize

from sweeper.estimate.predict import predict
from sweeper.spec.traits import PipelineStall, TimeTraits

STALL_EXCESS_S = 0.5  # measured over modelled seconds per micro-batch beyond which a row stalled
NODES = (1, 2, 4, 8, 16, 32, 64)


def rank_corr(a: np.ndarray, b: np.ndarray) -> float:
    return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def stall_table(groups: Sequence[Any], traits: TimeTraits) -> pd.DataFrame:
    """One row per measured layout: its cell, part, nodes, pp, micro-batches, measured and modelled
    (without the stall) step, and whether it stalled."""
    base = replace(traits, pp_stall=None)
    rows = []
    for k, g in enumerate(groups):
        model = predict(g.cols, g.sweep, traits=base).total
        m = np.maximum(g.cols["grad_accum"], 1).astype(float)
        for i in range(len(g.measured_s)):
            rows.append(
                {
                    "group": k,
                    "held_out": g.held_out,
                    "nodes": g.sweep.cluster.nodes,
                    "pp": int(g.cols["pp"][i]),
                    "m": m[i],
                    "measured": float(g.measured_s[i]),
                    "model": float(model[i]),
                }
            )
    t = pd.DataFrame(rows)
    t["excess"] = (t.measured - t.model) / t.m  # seconds per micro-batch the model does not explain
    t["stalled"] = t.excess > STALL_EXCESS_S
    return t


def fit_stall(t: pd.DataFrame) -> tuple[PipelineStall, int, int]:
    """The stall fitted on the FIT cells' pp > 1 rows: the share a logistic in the nodes (maximum
    likelihood), the seconds the stalled rows' median excess; with the rows and stalled rows used."""
    fit = t[~t.held_out & (t.pp > 1)]
    nodes, y = fit.nodes.to_numpy(float), fit.stalled.to_numpy(float)

    def nll(p: np.ndarray) -> float:
        q = np.clip(1.0 / (1.0 + np.exp(-(nodes - p[0]) / max(p[1], 1e-3))), 1e-9, 1 - 1e-9)
        return float(-(y * np.log(q) + (1 - y) * np.log(1 - q)).sum())

    half, width = minimize(nll, np.array([32.0, 8.0]), method="Nelder-Mead").x
    seconds = float(fit[fit.stalled].excess.median())
    return PipelineStall(round(seconds, 2), round(float(half), 1), round(float(width), 1)), len(fit), int(y.sum())


def goals(groups: Sequence[Any], traits: TimeTraits, keep: list[np.ndarray] | None = None) -> dict[str, str]:
    """The goals' figures (Spearman, predicted best over best, median |step-time error|) per part,
    on the rows `keep` says (every row if None)."""
    out = {}
    for part, sel in (("fit", False), ("held-out", True)):
        rho, best, err = [], [], []
        for k, g in enumerate(groups):
            if g.held_out != sel:
                continue
            rows = keep[k] if keep is not None else np.ones(len(g.measured_s), bool)
            pred, meas = predict(g.cols, g.sweep, traits=traits).total[rows], g.measured_s[rows]
            err.append(np.abs(pred / meas - 1))
            if len(meas) >= 3:
                rho.append(rank_corr(1 / pred, 1 / meas))
                best.append(float(meas.min() / meas[np.argmin(pred)]))
        out[part] = (
            f"spearman median {np.median(rho):.2f} (worst {min(rho):.2f}), predicted best {np.median(best):.3f} "
            f"(worst {min(best):.3f}), median |error| {100 * np.median(np.concatenate(err)):.1f}%"
        )
    return out


def share_line(t: pd.DataFrame, label: str) -> str:
    cells = []
    for n in NODES:
        r = t[t.nodes == n]
        cells.append(f"{100 * r.stalled.mean():>5.0f}%" if len(r) else f"{'-':>6}")
    return f"  {label:<38}" + "".join(cells)


def report(groups: Sequence[Any], traits: TimeTraits) -> None:
    """Print the stall from the data, its fit, and the goals without the rows that stalled."""
    t = stall_table(groups, traits)
    pp = t[t.pp > 1]
    stall, n_rows, n_stalled = fit_stall(t)
    print(
        f"\nultrascale's pipeline stall: a row stalled when its measured step exceeds the model's without the stall"
        f" by > {STALL_EXCESS_S} s per micro-batch"
    )
    print(f"  {'nodes':<38}" + "".join(f"{n:>6}" for n in NODES))
    print(f"  {'pp > 1 rows':<38}" + "".join(f"{int((pp.nodes == n).sum()):>6}" for n in NODES))
    print(share_line(pp, "  stalled, all cells"))
    print(share_line(pp[~pp.held_out], "  stalled, fit cells"))
    print(share_line(pp[pp.held_out], "  stalled, held-out cells"))
    print(share_line(t[t.pp == 1], "pp = 1 rows stalled"))
    med = [pp[(pp.nodes == n) & pp.stalled] for n in NODES]
    print(
        f"  {'stalled s per micro-batch (median)':<38}" + "".join(f"{(r.measured / r.m).median():>6.2f}" for r in med)
    )
    print(f"  {'  of it unexplained (median excess)':<38}" + "".join(f"{r.excess.median():>6.2f}" for r in med))
    print(
        f"  fitted on the fit cells' {n_rows} pp > 1 rows ({n_stalled} stalled): share logistic((nodes - "
        f"{stall.half_nodes}) / {stall.width}) ({', '.join(f'{100 * stall.share(n):.0f}%' for n in NODES)}), "
        f"{stall.seconds} s per micro-batch; nanotron's trait: {traits.pp_stall}"
    )
    keep = [~t[t.group == k].stalled.to_numpy() for k in range(len(groups))]
    base = replace(traits, pp_stall=None)
    for part, line in goals(groups, base, keep).items():
        print(f"  the goals on the {int((~t.stalled).sum())} rows that did not stall, {part}: {line}")
    priced: list[tuple[str, Literal["expected", "typical"]]] = [
        ("expected cost (share x seconds)", "expected"),
        ("typical run's cost (nanotron's)", "typical"),
    ]
    for name, how in priced:
        tr = replace(traits, pp_stall=replace(stall, priced=how))
        for part, line in goals(groups, tr).items():
            print(f"  the fitted stall priced as its {name}, {part}: {line}")
