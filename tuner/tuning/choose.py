"""Choosing what ships from the judged candidates: never worse than the original or the peers.

A candidate is chosen only when its speedup interval clears 1 + epsilon (its verdict is
"faster"); among those the fastest, except that the best peer (`tuner.backends.registry.PEERS`,
what a user would pick instead of fxtune) is the floor: a candidate with passes replaces it only
when its interval lies above the peer's speedup. Each was timed against the original, not
against the other, so a tie by point estimate is noise, and in a tie the user's own pick ships.
When nothing is faster, the original stands.
"""

from __future__ import annotations

from tuner.backends import registry as backends
from tuner.contract.config import Figures, Verdict
from tuner.passes.apply import Transformed
from tuner.search.buckets import ORIGINAL
from tuner.tuning.candidates import Candidate
from tuner.tuning.run import Captured

NOTHING_FASTER = "no candidate was faster than the original beyond noise; the original stands"


def original(captured: Captured, verdict: Verdict, reason: str) -> tuple[Figures, Candidate]:
    """The untouched program as the choice, with the verdict and reason that put it there."""
    fig = Figures(name=ORIGINAL, backend="eager", passes=[], verdict=verdict, reason=reason)
    gm0 = captured.gm
    return fig, Candidate(ORIGINAL, "eager", [], Transformed(gm0, captured.inputs), gm0)


def choose(
    captured: Captured, candidates: list[Candidate], figures: list[Figures], notes: list[str]
) -> tuple[Figures, Candidate]:
    """The fastest candidate whose interval clears 1 + epsilon, the peer it ties with, or the
    original; a tie with the peer is said in `notes`."""
    winners = [
        (f, c) for f, c in zip(figures, candidates, strict=True) if f.verdict == Verdict.FASTER
    ]
    if not winners:
        return original(captured, Verdict.WITHIN_NOISE, NOTHING_FASTER)
    best = max(winners, key=lambda fc: fc[0].speedup or 0.0)
    plain = [(f, c) for f, c in winners if not c.passes and c.backend in backends.PEERS]
    if not plain:
        return best
    peer = max(plain, key=lambda fc: fc[0].speedup or 0.0)
    low = best[0].ci[0] if best[0].ci else None
    if best[1] is peer[1] or (low is not None and low > (peer[0].speedup or 0.0)):
        return best
    notes.append(
        f"{best[1].name} measured {best[0].speedup:.3f}x and {peer[1].name} "
        f"{peer[0].speedup:.3f}x over the original: within each other's noise, so "
        f"the peer ships"
    )
    return peer
