"""Step-to-step noise: each trial's interval of its mean step time (and so of its MFU), and whether
the best layout beats the runner-up beyond that noise.

A step time is a sample. The interval is the 95 % Student-t confidence interval of the mean of the
measured steps (after the warm-up): mean ± t(0.975, n - 1) · s / √n, with s the steps' sample
standard deviation. MFU is a fixed amount of work over the step time, so its interval is the same
interval inverted: [mfu · mean / (mean + h), mfu · mean / (mean - h)], with no upper end when
h ≥ mean. Two layouts whose intervals overlap are a tie within noise, never a win (DESIGN.md,
"Noise"). Step-to-step spread does not show drift between runs (another job on the node, a warmer
card), which only a repeat of both layouts measures. Pure: no torch.
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

CONFIDENCE = 0.95
INTERVAL_NAME = "95% t interval of the mean step time"
MAX_STEPS = 100_000  # beyond this many steps per trial, more steps are no way to settle a tie


def t_factor(steps: int, confidence: float = CONFIDENCE) -> float:
    """Student's t quantile for a two-sided `confidence` interval of the mean of `steps` samples."""
    if steps < 2 or not 0 < confidence < 1:
        raise ValueError(f"a t interval needs 2 or more steps and a confidence in (0, 1), not {steps} and {confidence}")
    return _t_quantile(steps - 1, (1 + confidence) / 2)


# Computed here, not by scipy.special's `stdtrit` (the same number, to 1e-12 relative below 1000 steps and
# 1e-10 at 100,000, where lgamma's differences lose digits): importing scipy.special
# cost every process that asks for an interval about 0.3 s of CPU (each trial's worker, `sweep run`,
# `best`, `status`, `report`), for one function.
@functools.cache
def _t_quantile(df: int, p: float) -> float:
    """The `p` quantile (1/2 < p < 1) of Student's t with `df` degrees of freedom: Newton's method on its
    upper tail from the normal's quantile, which lies below it; the tail is convex there, so each step
    stays below the answer and the steps shrink to it."""
    t = statistics.NormalDist().inv_cdf(p)
    for _ in range(200):
        step = (_t_upper_tail(t, df) - (1 - p)) / _t_density(t, df)
        t += step
        if step <= 4 * sys.float_info.epsilon * t:
            break
    return t


def _t_upper_tail(t: float, df: int) -> float:
    """P(T > t) for t >= 0: half the regularized incomplete beta I_x(df/2, 1/2) at x = df / (df + t²)."""
    return 0.5 * _beta_regularized(df / 2, 0.5, df / (df + t * t), t * t / (df + t * t))


def _t_density(t: float, df: int) -> float:
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))


def _beta_regularized(a: float, b: float, x: float, y: float) -> float:
    """I_x(a, b), with y = 1 - x given apart (exact where x is near 1); the continued fraction where it
    converges fast, else through I_x(a, b) = 1 - I_y(b, a) (Numerical Recipes, 6.4)."""
    if x <= 0 or y <= 0:
        return 0.0 if x <= 0 else 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1 - math.exp(log_front) * _beta_fraction(b, a, y) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The incomplete beta's continued fraction, by the modified Lentz method."""
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    out = d
    for m in range(1, 10_000):
        for num in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1 + num * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + num / c
            c = c if abs(c) > tiny else tiny
            out *= d * c
        if abs(d * c - 1) < sys.float_info.epsilon:
            break
    return out


@dataclass(frozen=True)
class StepInterval:
    """The confidence interval of one trial's mean step time, from its measured steps."""

    mean_s: float
    std_s: float  # sample standard deviation of one step
    steps: int  # measured steps (after the warm-up)

    @classmethod
    def of(cls, measured_s: Sequence[float]) -> StepInterval | None:
        """From the measured step times (warm-up dropped); None with fewer than 2 (no spread)."""
        if len(measured_s) < 2:
            return None
        return cls(statistics.fmean(measured_s), statistics.stdev(measured_s), len(measured_s))

    @property
    def half_width_s(self) -> float:
        return t_factor(self.steps) * self.std_s / math.sqrt(self.steps)

    def mfu_range(self, mfu: float) -> tuple[float, float | None]:
        """The MFU interval that the step-time interval gives (None above: no upper end)."""
        h = self.half_width_s
        return mfu * self.mean_s / (self.mean_s + h), (
            mfu * self.mean_s / (self.mean_s - h) if h < self.mean_s else None
        )


def interval_fields(measured_s: Sequence[float], mfu: float | None) -> dict[str, Any]:
    """The results columns of the interval (`TrialResult`): all None with fewer than 2 measured steps."""
    iv = StepInterval.of(measured_s)
    if iv is None or mfu is None:
        return {"steps_measured": len(measured_s), "step_time_ci_s": None, "mfu_low": None, "mfu_high": None}
    low, high = iv.mfu_range(mfu)
    return {"steps_measured": iv.steps, "step_time_ci_s": iv.half_width_s, "mfu_low": low, "mfu_high": high}


def _number(v: Any) -> float | None:
    """A cell as a float: None for null and NaN (pandas reads a null float as NaN)."""
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def row_interval(row: Mapping[str, Any]) -> StepInterval | None:
    """A result row's interval from its columns; None for a row without a spread (fewer than 2
    measured steps, a replay table with only a mean, or a row written before intervals were kept)."""
    steps, mean, std = (_number(row.get(k)) for k in ("steps_measured", "step_time_mean_s", "step_time_std_s"))
    if steps is None or steps < 2 or mean is None or std is None:
        return None
    return StepInterval(mean, std, int(steps))


def row_mfu_range(row: Mapping[str, Any]) -> str:
    """A row's MFU interval for a table cell (`1.55–2.08%`), `-` for a row without a step-time spread."""
    iv = row_interval(row)
    if iv is None or _number(row.get("mfu")) is None:
        return "-"
    low, high = iv.mfu_range(float(row["mfu"]))
    return f"{100 * low:.2f}–" + ("∞" if high is None else f"{100 * high:.2f}%")


def steps_to_separate(a: StepInterval, b: StepInterval, limit: int = MAX_STEPS) -> int | None:
    """Measured steps per trial after which the two intervals no longer overlap, if the means and
    spreads stay as measured: the smallest n with t(n-1) · (s_a + s_b) / √n < |mean_a - mean_b|.
    None when no n up to `limit` does (equal means, or a gap far inside the noise)."""
    gap = abs(a.mean_s - b.mean_s)
    spread = a.std_s + b.std_s

    def apart(n: int) -> bool:
        return t_factor(n) * spread / math.sqrt(n) < gap

    if gap <= 0 or not apart(limit):
        return None
    # t(n-1)/√n falls with n: bisect, from the normal quantile's answer (t > 1.96 always: a lower bound)
    lo, hi = max(2, math.ceil((1.96 * spread / gap) ** 2)), limit
    if apart(lo):
        return lo
    while hi - lo > 1:  # apart(hi), not apart(lo)
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if apart(mid) else (mid, hi)
    return hi


class Verdict(StrEnum):
    """What the measurements say of the winner against the runner-up."""

    WIN = "win"  # the intervals do not overlap: a lead beyond step-to-step noise
    TIE = "tie"  # the intervals overlap: a tie within noise, to settle with more steps or a repeat
    UNKNOWN = "unknown"  # a row without a spread: the noise is not known


@dataclass(frozen=True)
class Margin:
    """The winner's lead over the runner-up, as far as the measurements support it."""

    verdict: Verdict
    winner: int  # trial numbers
    runner_up: int
    lead: float  # measured: the winner's MFU over the runner-up's, less 1 (its step is that much shorter)
    winner_mfu: tuple[float, float, float | None]  # MFU, low, high (high None: no upper end); unknown: MFU thrice
    runner_up_mfu: tuple[float, float, float | None]
    lead_low: float | None = None  # the lead between the intervals' near ends (> 0 for a win)
    lead_high: float | None = None  # between their far ends (None: no upper end)
    steps_now: int | None = None  # measured steps of each (the fewer)
    steps_to_settle: int | None = None  # measured steps each that would separate a tie
    warmup_steps: int | None = None  # of the trials' protocol, read from their rows

    def within_noise(self) -> bool:
        """The two intervals overlap: a tie, not a win."""
        return self.verdict is Verdict.TIE

    def sentence(self) -> str:
        """One line for the terminal and the report: the lead, or the tie and what would settle it."""
        w, r = self.winner_mfu, self.runner_up_mfu
        pair = f"trial {self.winner} ({mfu_text(w)}) and trial {self.runner_up} ({mfu_text(r)})"
        if self.verdict is Verdict.UNKNOWN:
            return (
                f"Trial {self.winner} leads trial {self.runner_up} by {100 * self.lead:.1f}%; whether that is beyond "
                "noise is unknown: a row without a step-time spread (fewer than 2 measured steps, or written "
                "before intervals were recorded)."
            )
        if self.verdict is Verdict.WIN:
            high = "" if self.lead_high is None else f" to {100 * self.lead_high:.1f}%"
            return (
                f"A win beyond noise: trial {self.winner} leads trial {self.runner_up} by {100 * self.lead:.1f}% "
                f"({100 * (self.lead_low or 0):.1f}%{high} between the ends of their intervals, {INTERVAL_NAME}: {pair})."
            )
        return f"A tie within noise: {pair} overlap ({INTERVAL_NAME}, {self.steps_now} measured steps); {self.settle()}"

    def settle(self) -> str:
        """What would tell the two apart."""
        repeat = "a repeat of both layouts (one run's step spread does not show drift between runs)"
        if self.steps_to_settle is None:
            return f"they measured too alike for more steps to separate them; to settle it: {repeat}."
        total = "" if self.warmup_steps is None else f" (trial.steps: {self.steps_to_settle + self.warmup_steps})"
        return (
            f"to settle it: about {self.steps_to_settle} measured steps each{total}, if their means and spreads "
            f"hold, or {repeat}."
        )


def mfu_text(v: tuple[float, float, float | None]) -> str:
    """`1.78% MFU, interval 1.55% to 2.08%` from (MFU, low, high)."""
    high = "no upper end" if v[2] is None else f"{100 * v[2]:.2f}%"
    return f"{100 * v[0]:.2f}% MFU, interval {100 * v[1]:.2f}% to {high}"


def margin(winner: Mapping[str, Any], runner_up: Mapping[str, Any]) -> Margin:
    """The winner's lead over the runner-up (two ok result rows, the winner first): a win when
    their MFU intervals do not overlap, a tie when they do, unknown when either has no interval."""
    wi, ri = row_interval(winner), row_interval(runner_up)
    w_mfu, r_mfu = float(winner["mfu"]), float(runner_up["mfu"])
    unknown = Margin(
        Verdict.UNKNOWN,
        int(winner["trial_number"]),
        int(runner_up["trial_number"]),
        w_mfu / r_mfu - 1,
        (w_mfu, w_mfu, w_mfu),
        (r_mfu, r_mfu, r_mfu),
    )
    if wi is None or ri is None:
        return unknown
    (w_low, w_high), (r_low, r_high) = wi.mfu_range(w_mfu), ri.mfu_range(r_mfu)
    tie = r_high is None or w_low <= r_high
    return replace(
        unknown,
        verdict=Verdict.TIE if tie else Verdict.WIN,
        winner_mfu=(w_mfu, w_low, w_high),
        runner_up_mfu=(r_mfu, r_low, r_high),
        lead_low=(w_low / r_high - 1) if r_high is not None else None,
        lead_high=(w_high / r_low - 1) if w_high is not None else None,
        steps_now=min(wi.steps, ri.steps),
        steps_to_settle=(_at_least(steps_to_separate(wi, ri), max(wi.steps, ri.steps) + 1) if tie else None),
        warmup_steps=_warmup(winner, wi),
    )


def _at_least(n: int | None, floor: int) -> int | None:
    return None if n is None else max(n, floor)


def _warmup(row: Mapping[str, Any], iv: StepInterval) -> int | None:
    """The warm-up steps of the row's protocol: its recorded steps less the measured ones."""
    times = row.get("step_times_s")
    return None if times is None or len(times) < iv.steps else len(times) - iv.steps
