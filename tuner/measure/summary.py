"""One summary of paired A/B timings, and one way to print its interval.

Search, whole-model judging, the config figures and `Comparison.to_dict` all read the same
`Summary`, so a site's "baseline" in a report is the same number the verdict was drawn from.

Non-finite samples: a round in which either side's time is not a finite positive number is a
failed timing (a timer that overflowed, a NaN from a broken event), not a measurement. The whole
round is dropped, from the ratio and from both medians alike: keeping it would let an infinite
sample move an upper median, and dropping it from one side only would unpair the medians from the
ratio they are reported next to. How many rounds were dropped is kept in `dropped`.

An interval bound is None ("open") where too few rounds were timed to bound the speedup on that
side (the sign-test rank is 0): the summary never pretends a bound of 0 or infinity was measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np

from tuner.contract.config import Interval


@dataclass(frozen=True)
class Summary:
    """Median speedup (baseline / candidate) with its interval; times are seconds per call."""

    speedup: float | None
    low: float | None
    high: float | None
    rounds: int
    baseline_s: float | None
    candidate_s: float | None
    dropped: int = 0
    confidence: float = 0.95

    @property
    def ci(self) -> Interval:
        return (self.low, self.high)


def _usable(x: float) -> bool:
    return math.isfinite(x) and x > 0


@cache
def order_rank(n: int, confidence: float) -> int:
    """The largest k with P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2; 0 if none.

    [x_(k), x_(n+1-k)] of n sorted samples then covers the median with probability at least
    `confidence`, whatever the distribution (the sign-test interval).
    """
    tail = Fraction(1 - confidence) / 2 * 2**n
    cumulative, k = 0, 0
    for j in range(n // 2 + 1):
        cumulative += math.comb(n, j)
        if cumulative > tail:
            break
        k = j + 1
    return k


def median_interval(
    values: Sequence[float], confidence: float
) -> tuple[float, float | None, float | None]:
    """Median and its distribution-free confidence interval; a bound is None when n is too small.

    The sign-test interval of the median: [x_(k), x_(n+1-k)] with k = `order_rank`.
    """
    if not len(values):
        return math.nan, None, None
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    center = float(np.median(ordered))
    k = order_rank(len(ordered), confidence)
    if k == 0:
        return center, None, None
    return center, float(ordered[k - 1]), float(ordered[len(ordered) - k])


def summarize(
    baseline_s: Sequence[float], candidate_s: Sequence[float], confidence: float = 0.95
) -> Summary:
    """The summary of paired samples (one pair per round), by the rule in the module docstring.

    Each round gives one log(t_base / t_cand); the estimate is exp(median) and the interval the
    sign-test interval of that median. Chosen over a t-interval because a shared machine's
    samples are skewed and carry outliers (one preempted sample would widen a t-interval for
    every later round and bias the mean), and over a bootstrap because the order-statistic
    interval has exact coverage for any distribution even at 8 rounds, needs no random seed and
    is cheap enough to re-evaluate after every round for the stopping rule. Logs make the
    statistic symmetric: a 2x win and a 2x loss are equally far from 1.
    """
    pairs = [
        (float(b), float(c))
        for b, c in zip(baseline_s, candidate_s, strict=True)
        if _usable(b) and _usable(c)
    ]
    dropped = len(baseline_s) - len(pairs)
    if not pairs:
        return Summary(None, None, None, 0, None, None, dropped, confidence)
    base = np.array([b for b, _ in pairs])
    cand = np.array([c for _, c in pairs])
    center, low, high = median_interval(np.log(base / cand), confidence)
    return Summary(
        speedup=math.exp(center),
        low=None if low is None else math.exp(low),
        high=None if high is None else math.exp(high),
        rounds=len(pairs),
        baseline_s=float(np.median(base)),
        candidate_s=float(np.median(cand)),
        dropped=dropped,
        confidence=confidence,
    )


def relative_width(s: Summary) -> float:
    """The interval's width relative to the estimate; inf while a side is open."""
    if s.speedup is None or s.low is None or s.high is None or s.speedup <= 0:
        return math.inf
    return (s.high - s.low) / s.speedup


def _bound(x: float) -> str:
    return f"{x:.2f}" if abs(x) >= 0.1 else f"{x:.3g}"


def format_interval(ci: Sequence[float | None] | None, missing: str = "-") -> str:
    """'[0.98, 1.04]'; an open side prints as such: '[0.98, open)', '(open, 1.04]', '(open)'.

    `missing` is for no interval at all (nothing was timed), which differs from an open one.
    """
    if ci is None or len(ci) != 2:
        return missing
    low, high = ci
    if low is None and high is None:
        return "(open)"
    left = "(open" if low is None else f"[{_bound(low)}"
    right = "open)" if high is None else f"{_bound(high)}]"
    return f"{left}, {right}"
