"""What an A/B timing amounts to: its samples and figures (`Comparison`), the figures a config
stores, and the verdict drawn from them. Every figure comes from `tuner.measure.summary`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tuner.contract.config import Verdict
from tuner.measure.summary import Summary, summarize


@dataclass
class Comparison:
    """The A/B result. Times are seconds per call; speedup > 1 means the candidate is faster."""

    baseline_s: list[float]
    candidate_s: list[float]
    speedup: float
    ci_low: float
    ci_high: float
    rounds: int
    stopped: str
    inner: int = 1
    confidence: float = 0.95
    device: str = "cpu"
    threads: int | None = None
    clock: str = "wall"  # what a CPU sample measured (`tuner.measure.timing.Clock`)

    @classmethod
    def from_samples(
        cls,
        baseline_s: Sequence[float],
        candidate_s: Sequence[float],
        stopped: str,
        *,
        inner: int = 1,
        confidence: float = 0.95,
        device: str = "cpu",
        threads: int | None = None,
        clock: str = "wall",
    ) -> Comparison:
        """The comparison of paired samples, its figures from `summarize` (an open interval side
        is 0 or inf here, None in `summary` and `to_dict`)."""
        s = summarize(baseline_s, candidate_s, confidence)
        return cls(
            list(baseline_s),
            list(candidate_s),
            math.nan if s.speedup is None else s.speedup,
            0.0 if s.low is None else s.low,
            math.inf if s.high is None else s.high,
            len(baseline_s),
            stopped,
            inner,
            confidence,
            device,
            threads,
            clock,
        )

    @property
    def summary(self) -> Summary:
        """The figures reported for this comparison (`tuner.measure.summary`: one rule)."""
        return summarize(self.baseline_s, self.candidate_s, self.confidence)

    @property
    def baseline_median_s(self) -> float:
        s = self.summary.baseline_s
        return math.nan if s is None else s

    @property
    def candidate_median_s(self) -> float:
        s = self.summary.candidate_s
        return math.nan if s is None else s

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, from `summary`: an open interval side (too few rounds) becomes None."""
        data = asdict(self)
        s = self.summary
        data.update(
            speedup=s.speedup,
            ci_low=s.low,
            ci_high=s.high,
            baseline_median_s=s.baseline_s,
            candidate_median_s=s.candidate_s,
            dropped_rounds=s.dropped,
        )
        return data


def timing_fields(c: Comparison) -> dict[str, Any]:
    """The summary of an A/B comparison as stored in a config (raw samples go to the report).

    Every config figure (sites, candidates, per size) comes from here, so from `c.summary`.
    """
    s = c.summary
    return {
        "baseline_s": s.baseline_s,
        "candidate_s": s.candidate_s,
        "speedup": s.speedup,
        "ci": s.ci,
        "rounds": s.rounds,
    }


def verdict(c: Comparison, epsilon: float = 0.02) -> Verdict:
    """'faster' only when ci_low > 1 + epsilon; 'slower' when ci_high < 1; else 'within noise'.

    The asymmetry is deliberate: keeping a rewrite needs evidence of a real win, while
    rejecting one needs only evidence that it does not help.
    """
    if c.ci_low > 1 + epsilon:
        return Verdict.FASTER
    if c.ci_high < 1:
        return Verdict.SLOWER
    return Verdict.WITHIN_NOISE
