"""Size buckets: where the measured winners differ by size, one decision per range of one dim.

A dynamic program is tuned at several sizes (`tuner.graph.sizes`), and each whole-model candidate is
measured at each (`Figures.per_size`). Inductor and torch.compile pick one graph for every size;
here, when the candidate that wins at small batches is not the one that wins at large ones,
each range of sizes gets the candidate that won inside it, and the tuned artifacts pick the
range's module per call.

The rule (`plan_buckets`), on one dynamic dimension (the only one whose size varies across the
measured points; with several varying together there is no single axis to split, and no buckets):

1. At each measured size, the winner is the fastest candidate whose verdict there is "faster"
   (its speedup interval clears 1 + epsilon against the original, measured at that size), or the
   original when none is. The run's overall choice (never worse at any size) is kept as that
   size's winner when it is "faster" there and its interval overlaps the fastest one's, and
   so is the next smaller size's winner: a difference inside the noise does not split.
2. Consecutive sizes with the same winner form one bucket; one bucket overall means no buckets
   (the config is as before: one decision set for every size).
3. Between the largest size a of one bucket and the smallest size b of the next, the boundary is
   the geometric midpoint: the lower bucket ends at isqrt(a * b), the next starts one above
   (sizes are spread geometrically, 2, 32, 512, so this is the halfway point in log-size). The
   first bucket starts at the dimension's minimum and the last ends at its maximum, so the
   buckets cover exactly the range the program serves.

Each bucket's decision was measured at every size inside it and is "faster" at each of them,
which is the never-worse rule restricted to the bucket. The choice is among the whole-model
candidates (the peers, the never-worse tuned passes, every pass, and per measured size the
never-worse sites plus those faster at that size, under each backend: `Tuner._size_candidates`),
so a bucket's pass set is one of those, measured whole; the site search is not rerun per
bucket. Sizes between measured ones take the decision of the bucket they fall in: that is
interpolation, stated as such, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.contract.config import Bucket, Figures, PassStep, SizeFigures, Verdict
from tuner.graph.shapes import DynamicDim, ShapeSpec
from tuner.graph.sizes import SizePoint

ORIGINAL = "original"


@dataclass(frozen=True)
class Plan:
    """One planned bucket: its range, the measured points inside, and the winner's name."""

    dim: str
    min: int
    max: int | None
    points: tuple[SizePoint, ...]
    winner: str  # a candidate's name, or ORIGINAL

    @property
    def measured(self) -> list[int]:
        return [p.sizes[self.dim] for p in self.points]


def bucket_dim(spec: ShapeSpec | None, points: Sequence[SizePoint]) -> DynamicDim | None:
    """The one dynamic dimension whose size differs across the measured points, if exactly one."""
    if spec is None or len(points) < 2:
        return None
    varying = [d for d in spec.dims if len({p.sizes.get(d.name) for p in points}) > 1]
    return varying[0] if len(varying) == 1 else None


def _at(fig: Figures, label: str) -> SizeFigures | None:
    return next((f for f in fig.per_size if f.label == label), None)


def winner_at(label: str, figures: Sequence[Figures], prefer: Sequence[str]) -> str:
    """The candidate that won at one measured size (rule 1 in the module's docstring); the
    first of `prefer` that is "faster" there and whose interval overlaps the fastest one's
    stands instead of it (a difference the measurements cannot tell from noise)."""
    faster = {
        f.name: s
        for f in figures
        if (s := _at(f, label)) is not None and s.verdict == Verdict.FASTER
    }
    if not faster:
        return ORIGINAL
    best_name = max(faster, key=lambda n: faster[n].speedup or 0.0)
    best = faster[best_name]
    best_low = best.ci[0] if best.ci is not None and best.ci[0] is not None else best.speedup
    for name in prefer:
        s = faster.get(name)
        if s is None:
            continue
        high = s.ci[1] if s.ci is not None else None
        if high is None or best_low is None or high >= best_low:
            return name
    return best_name


def plan_buckets(
    spec: ShapeSpec | None, points: Sequence[SizePoint], figures: Sequence[Figures], chosen: str
) -> list[Plan]:
    """The buckets the measurements call for; [] when one decision wins at every size."""
    dim = bucket_dim(spec, points)
    if dim is None:
        return []
    ordered = sorted(points, key=lambda p: p.sizes[dim.name])
    runs: list[tuple[str, list[SizePoint]]] = []
    for point in ordered:
        # The run's choice first, then the neighbouring size's winner: noise splits neither.
        won = winner_at(point.label, figures, [chosen, *(r[0] for r in runs[-1:])])
        if runs and runs[-1][0] == won:
            runs[-1][1].append(point)
        else:
            runs.append((won, [point]))
    if len(runs) < 2:
        return []
    plans: list[Plan] = []
    low = dim.min
    for i, (won, inside) in enumerate(runs):
        if i + 1 < len(runs):
            a, b = inside[-1].sizes[dim.name], runs[i + 1][1][0].sizes[dim.name]
            high: int | None = math.isqrt(a * b)
        else:
            high = dim.max
        plans.append(Plan(dim.name, low, high, tuple(inside), won))
        low = (high or 0) + 1
    return plans


def to_bucket(plan: Plan, fig: Figures | None) -> Bucket:
    """The config's record of a planned bucket (`fig`: the winner's figures; None: original)."""
    labels = [p.label for p in plan.points]
    if fig is None:
        return Bucket(
            dim=plan.dim,
            min=plan.min,
            max=plan.max,
            measured=plan.measured,
            name=ORIGINAL,
            backend="eager",
            passes=[],
            reason=f"no candidate was faster than the original beyond noise at {', '.join(labels)}",
        )
    per_size = sorted(
        (s for s in fig.per_size if s.label in labels), key=lambda s: labels.index(s.label)
    )
    return Bucket(
        dim=plan.dim,
        min=plan.min,
        max=plan.max,
        measured=plan.measured,
        name=fig.name,
        backend=fig.backend,
        passes=[PassStep.model_validate(p.model_dump(by_alias=True)) for p in fig.passes],
        per_size=per_size,
    )
