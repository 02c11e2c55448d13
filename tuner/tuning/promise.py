"""Which whole-model candidates can still win, judged from what the run has measured.

A candidate is a backend with pass steps. By the time the search's candidates are judged, the
run has timed each backend on the untouched program (the peers) and the same pass steps in eager
(no build), so it can predict a candidate's speed as the product of the two gains. Timed in the
order of that prediction, the most promising go first (on the seeds' recommendation model,
AOTInductor with every pass, 4x over eager, went unmeasured at a 120 s budget behind ONNX Runtime
variants running at 0.06x); a candidate whose prediction, even `SLACK` times better, stays
below the best speed measured is not timed at all, and the report says why. A backend or pass
set not measured leaves no prediction: such candidates are timed after the predicted ones.
Inductor's own settings come last, on the fastest inductor candidate, where they can still win
(`with_settings`).
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.backends.inductor_settings import BEST_GAIN, available, label
from tuner.contract.config import Figures, Verdict
from tuner.tuning.candidates import WRONG, Candidate, identity

# How much better than the product of its parts a candidate may turn out (measured: inductor
# with every pass ran 1.24x faster than AOTInductor's gain times every pass's gain in eager on
# the recommendation model, where fusing 26 embedding bags let inductor fuse what follows).
SLACK = 2.0
# Predictions this close are not told apart: the eager figures they come from are each a few
# percent wide.
TIE = 1.05

Key = tuple[str, tuple[tuple[str, tuple[str, ...]], ...]]


def _speed(fig: Figures) -> float | None:
    if fig.verdict in WRONG or fig.verdict == Verdict.NOT_MEASURED or not fig.speedup:
        return None
    return fig.speedup


def measured(cands: Sequence[Candidate], figures: Sequence[Figures]) -> dict[Key, float]:
    """Each measured candidate's speed over the original, by backend and passes."""
    found: dict[Key, float] = {}
    for cand, fig in zip(cands, figures, strict=True):
        speed = _speed(fig)
        if speed is not None:
            found[identity(cand)] = speed
    return found


def predicted(cand: Candidate, speeds: dict[Key, float]) -> float | None:
    """The backend's gain on the untouched program times these passes' gain in eager."""
    backend, passes = identity(cand)
    alone, in_eager = speeds.get((backend, ())), speeds.get(("eager", passes))
    if backend == "eager" or alone is None or in_eager is None:
        return None
    return alone * in_eager


def by_promise(
    cands: Sequence[Candidate], speeds: dict[Key, float]
) -> tuple[list[Candidate], list[tuple[Candidate, Figures]]]:
    """(the candidates to time, most promising first, those without a prediction last; those
    that cannot win, each with its figures saying why)."""
    best = max([1.0, *speeds.values()])
    scored = [(cand, predicted(cand, speeds)) for cand in cands]
    hopeless = [
        (cand, _not_timed(cand, guess, best, speeds))
        for cand, guess in scored
        if guess is not None and guess * SLACK < best
    ]
    dropped = {id(c) for c, _ in hopeless}
    kept = [(c, g) for c, g in scored if id(c) not in dropped]
    ranked = _ties_to_more_rewrites(
        sorted((x for x in kept if x[1] is not None), key=lambda x: -(x[1] or 0.0))
    )
    return [c for c, _ in ranked] + [c for c, g in kept if g is None], hopeless


def _ties_to_more_rewrites(
    ranked: list[tuple[Candidate, float | None]],
) -> list[tuple[Candidate, float | None]]:
    """Predictions within `TIE` of the first of their run are one tie, led by the candidate
    that rewrites more sites: fused structures compound under a compiler in ways eager cannot
    show (the recommendation model: the tuned passes and every pass both 2.0x in eager, 2.75x
    and 3.70x under AOTInductor; at 120 s only the first of the two was built)."""
    out: list[tuple[Candidate, float | None]] = []
    group: list[tuple[Candidate, float | None]] = []
    for item in ranked:
        if group and (item[1] or 0.0) * TIE < (group[0][1] or 0.0):
            out += sorted(group, key=lambda x: -_sites(x[0]))
            group = []
        group.append(item)
    return out + sorted(group, key=lambda x: -_sites(x[0]))


def _sites(cand: Candidate) -> int:
    return sum(len(step.sites) for step in cand.passes)


def _not_timed(cand: Candidate, guess: float, best: float, speeds: dict[Key, float]) -> Figures:
    backend, passes = identity(cand)
    reason = (
        f"not timed: {backend} alone ran at {speeds[(backend, ())]:.2f}x and these passes in "
        f"eager at {speeds[('eager', passes)]:.2f}x, so it is expected near {guess:.2f}x; "
        f"even {SLACK:g}x that stays below the {best:.2f}x already measured"
    )
    return _figures_not_timed(cand, reason)


def with_settings(
    cands: Sequence[Candidate], figures: Sequence[Figures], device_kind: str
) -> tuple[list[Candidate], list[tuple[Candidate, Figures]]]:
    """Inductor's settings (`tuner.backends.inductor_settings`) on the fastest inductor
    candidate measured: (those to time, in the settings' order; those that cannot win, each
    with why). They have run at most `BEST_GAIN` times faster than the default build, so
    where that stays below the best speed measured none is built."""
    measured_inductor = [
        (cand, speed)
        for cand, fig in zip(cands, figures, strict=True)
        if cand.backend == "inductor" and not cand.settings and (speed := _speed(fig))
    ]
    names = available(device_kind)
    if not measured_inductor or not names:
        return [], []
    base, speed = max(measured_inductor, key=lambda x: x[1])
    made = [
        Candidate(base.name + label(n), "inductor", base.passes, base.transformed, settings=n)  # type: ignore[arg-type]
        for n in names
    ]
    best = max([1.0, *(s for f in figures if (s := _speed(f)))])
    if speed * BEST_GAIN >= best:
        return made, []
    reason = (
        f"not timed: {base.name} ran at {speed:.2f}x and inductor's settings have run at most "
        f"{BEST_GAIN:g}x faster than its default build, which stays below the {best:.2f}x "
        "already measured"
    )
    return [], [(c, _figures_not_timed(c, reason)) for c in made]


def _figures_not_timed(cand: Candidate, reason: str) -> Figures:
    return Figures(
        name=cand.name,
        backend=cand.backend,
        passes=cand.passes,
        settings=cand.settings,
        verdict=Verdict.NOT_MEASURED,
        reason=reason,
    )
