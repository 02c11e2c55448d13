"""One verdict from verdicts measured at several sizes: never worse at any measured size.

A dynamic program has one graph for every size (no per-size dispatch yet), so a rewrite is kept
only if it is right at every measured size, slower at none, and faster beyond noise at one or
more. The example size's figures stay the headline; each size's figures are kept alongside.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tuner.contract.config import SizeFigures, Verdict

# Verdicts that rule a rewrite out whatever the other sizes say, most serious first.
BLOCKING = (
    Verdict.WRONG_OUTPUTS,
    Verdict.CRASHED,
    Verdict.FAILED_TO_RUN,
    Verdict.SLOWER,
    Verdict.NOT_MEASURED,
)


def size_figures(label: str, sizes: dict[str, int], fields: dict[str, Any]) -> SizeFigures:
    keep = ("baseline_s", "candidate_s", "speedup", "ci", "rounds", "verdict", "reason")
    return SizeFigures(label=label, sizes=sizes, **{k: fields[k] for k in keep if k in fields})


def combined_verdict(per_size: Sequence[SizeFigures]) -> tuple[Verdict, str | None]:
    """(verdict, reason) across sizes: the first blocking verdict found, else "faster" when any
    size is faster, else "within noise"."""
    for blocking in BLOCKING:
        hit = [f for f in per_size if f.verdict == blocking]
        if hit:
            where = ", ".join(f.label for f in hit)
            why = f"{blocking} at {where}"
            if hit[0].reason:
                why += f" ({hit[0].reason})"
            return blocking, why
    if any(f.verdict == Verdict.FASTER for f in per_size):
        return Verdict.FASTER, None
    return Verdict.WITHIN_NOISE, None
