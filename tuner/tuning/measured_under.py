"""What was measured under what, and what runs where the chosen runtime is missing.

The per-site decisions are timed with each site extracted and run in eager; the whole-model
choice times every candidate as it ships, under its own backend. A pass set chosen under eager
need not pay under the backend that ships (a runtime fuses what the passes fuse, or fuses less
after them), so the config says, per backend, how the original and each pass set measured
(`MeasuredUnder`), and notes where the passes won under eager and lost under the backend that
ships, or the reverse. Where a runtime ships, `fallback_of` names the next-best measured
candidate that needs none, which a deployment without that runtime installed runs instead.
"""

from __future__ import annotations

from tuner.backends.runtimes import RUNTIMES, installed_version, is_runtime
from tuner.contract.config import (
    Fallback,
    Figures,
    MeasuredUnder,
    PassesUnder,
    RuntimeArtifact,
    Verdict,
)
from tuner.search.buckets import ORIGINAL

TUNED, EVERY = " + tuned passes", " + every pass"
MEASURED = (Verdict.FASTER, Verdict.SLOWER, Verdict.WITHIN_NOISE)
# Two whole-model figures closer than this are not told apart in the notes (each was timed
# against the original, not against the other: `tuner.tuning.choose`).
NOISE = 0.02


def _speedup(fig: Figures | None) -> float | None:
    if fig is None or fig.verdict not in MEASURED or fig.speedup is None:
        return None
    return round(fig.speedup, 4)


def passes_under(figures: list[Figures]) -> list[PassesUnder]:
    """Per backend, eager (the original) first, then in the order first judged: the backend
    alone and with each pass set."""
    by_name = {f.name: f for f in figures}
    order = list(dict.fromkeys(["eager", *(f.backend for f in figures)]))
    out: list[PassesUnder] = []
    for b in order:
        alone = 1.0 if b == "eager" else _speedup(by_name.get(b))
        out.append(
            PassesUnder(
                backend=b,
                alone=alone,
                tuned_passes=_speedup(by_name.get(b + TUNED)),
                every_pass=_speedup(by_name.get(b + EVERY)),
            )
        )
    return out


def _notes(rows: list[PassesUnder], shipped: str, has_sites: bool) -> list[str]:
    notes = [
        "per-site decisions: each site timed in eager (extracted from the model); whole-model "
        f"candidates: each timed as it ships, under its own backend; {shipped} ships"
    ]
    eager = next((r for r in rows if r.backend == "eager"), None)
    under_eager = eager.tuned_passes if eager is not None else None
    for row in rows:
        if row.backend == "eager" or row.alone is None:
            continue
        for label, value in (
            ("the tuned passes", row.tuned_passes),
            ("every pass", row.every_pass),
        ):
            if value is None or (label == "the tuned passes" and not has_sites):
                continue
            won_in_eager = label == "the tuned passes" and (under_eager or 0.0) > 1 + NOISE
            ratio = value / row.alone
            if abs(ratio - 1) <= NOISE:
                if row.backend == shipped:
                    notes.append(
                        f"under {row.backend}, {label} measured {value:.3f}x against "
                        f"{row.alone:.3f}x for {row.backend} alone: no difference beyond noise"
                    )
                continue
            if value < row.alone and (row.backend == shipped or won_in_eager):
                notes.append(
                    f"under {row.backend}, {label} measured {value:.3f}x against {row.alone:.3f}x "
                    f"for {row.backend} alone: they did not pay there"
                    + (f" (in eager: {under_eager:.3f}x)" if won_in_eager else "")
                )
            elif value > row.alone and row.backend == shipped:
                notes.append(
                    f"under {row.backend}, {label} measured {value:.3f}x against {row.alone:.3f}x "
                    f"for {row.backend} alone"
                )
    return notes


def measured_under(figures: list[Figures], shipped: str, has_sites: bool) -> MeasuredUnder:
    rows = passes_under(figures)
    return MeasuredUnder(backends=rows, notes=_notes(rows, shipped, has_sites))


def fallback_of(figures: list[Figures]) -> Fallback:
    """The fastest candidate faster than the original that needs no runtime; else the original."""
    usable = [
        f
        for f in figures
        if f.verdict == Verdict.FASTER and not is_runtime(f.backend) and f.speedup is not None
    ]
    if not usable:
        return Fallback(name=ORIGINAL, backend="eager", passes=[], speedup=1.0)
    best = max(usable, key=lambda f: f.speedup or 0.0)
    return Fallback(
        name=best.name,
        backend=best.backend,
        passes=best.passes,
        speedup=best.speedup,
        settings=best.settings,
    )


def runtime_artifact(backend: str) -> RuntimeArtifact | None:
    """The chosen runtime's artifact record (its file and digest are set when it is written)."""
    if not is_runtime(backend):
        return None
    runtime = RUNTIMES[backend]
    return RuntimeArtifact(
        runtime=backend, version=installed_version(backend) or "unknown", format=runtime.format
    )
