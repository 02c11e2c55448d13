"""Size buckets for a dynamic program whose per-size winners differ (`tuner.search.buckets`).

Each bucket's decision is verified at the sizes measured inside it, and the one program that
dispatches between the buckets' graphs (`tuner.deploy.dispatch.dispatching_program`) is built
and checked at every size; any failure leaves one decision set for every size, and the note
in the config says why.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.export import ExportedProgram

from tuner.backends.compile_time import CompileTimes
from tuner.contract.config import Bucket, Figures, Verdict, Verification
from tuner.contract.device import Device
from tuner.deploy.dispatch import dispatching_program
from tuner.graph.copying import deep_copy
from tuner.graph.sizes import SizePoint
from tuner.host import failures
from tuner.measure.equivalence import ReferenceMemo, ReferenceOutputs
from tuner.measure.inputs import fresh_inputs
from tuner.passes.apply import Transformed
from tuner.search.across_sizes import combined_verdict
from tuner.search.buckets import ORIGINAL, Plan, bucket_dim, plan_buckets, to_bucket
from tuner.tuning.candidates import Candidate, serves_every_size
from tuner.tuning.choose import original
from tuner.tuning.run import Captured, Verified
from tuner.tuning.verify import replayed_and_checked

# Where compile times are kept, the export of the dispatching program goes by this name: it is
# the buckets' build, as long as an AOTInductor compile on a large model, and runs in this process.
DISPATCH_EXPORT = "dispatch-export"


@dataclass
class DispatchCost:
    """What exporting the dispatching program is expected to take (this machine's history,
    else a prior, scaled by the load: `tuner.backends.compile_time`) and the seconds the budget
    leaves for it when asked; the export is not started where it would overrun."""

    times: CompileTimes
    hardware: str
    left_s: Callable[[], float]

    def refusal(self, nodes: int) -> str | None:
        expected, _ = self.times.planning_estimate(self.hardware, DISPATCH_EXPORT, nodes)
        left = self.left_s()
        if expected <= left:
            return None
        return (
            f"exporting the dispatching program ({nodes} nodes) is estimated at "
            f"{expected:.0f} s and {max(left, 0.0):.0f} s of the time budget are left"
        )

    def record(self, nodes: int, seconds: float) -> None:
        self.times.record(self.hardware, DISPATCH_EXPORT, nodes, seconds)


@dataclass
class BucketOutcome:
    """One size bucket as it ships: its config record, replayed module, runner and package."""

    bucket: Bucket
    tuned: Transformed
    runner: Callable[..., Any]
    package: Path | None = None


@dataclass
class Bucketed:
    """The buckets that ship (none: one decision set), the example bucket's decision as the
    headline, the dispatching program, and a note for the config saying what happened."""

    outcomes: list[BucketOutcome] = field(default_factory=list)
    headline: Verified | None = None  # set when there are buckets
    dispatch: ExportedProgram | None = None
    note: str = ""


def bucketed(
    program: ExportedProgram,
    captured: Captured,
    points: list[SizePoint],
    candidates: list[Candidate],
    figures: list[Figures],
    chosen: str,
    device: Device,
    memo: ReferenceMemo | None = None,
    cost: DispatchCost | None = None,
) -> Bucketed:
    """Size buckets where the per-size winners differ, each verified at the sizes measured
    inside it, and the dispatching program built and checked at every size; any failure
    leaves one decision set for every size (the note says why), as does a dispatching program
    that `cost` says the budget cannot export. The original's outputs come from `memo` where
    the run has them."""
    if len(points) < 2:
        return Bucketed()
    if bucket_dim(captured.spec, points) is None:
        return Bucketed(note="not bucketed: the sizes measured vary along several dims")
    plans = plan_buckets(captured.spec, points, figures, chosen)
    if not plans:
        return Bucketed(note="one decision for every size measured")
    by_name = {c.name: (c, f) for c, f in zip(candidates, figures, strict=True)}
    winners = [by_name[p.winner][0] for p in plans if p.winner != ORIGINAL]
    if any(c.transformed.packers for c in winners):
        return Bucketed(note="not bucketed: a bucket's winner changes the inputs")
    head = by_name.get(chosen)
    if any(serves_every_size(c) for c in [*winners, *([head[0]] if head else [])]):
        return Bucketed(
            note="not bucketed: a winner serves every size from one build (a runtime's "
            "artifact, or a package with inductor's settings)"
        )
    outcomes: list[BucketOutcome] = []
    checks: list[Verification] = []
    for plan in plans:
        outcome, check = _verify_bucket(program, captured, plan, by_name, device, memo)
        outcomes.append(outcome)
        checks.append(check)
    trials = [p.inputs for p in points]
    nodes = sum(len(o.tuned.gm.graph.nodes) for o in outcomes)
    refused = cost.refusal(nodes) if cost is not None else None
    if refused is not None:
        return Bucketed(note=f"not bucketed: {refused}")
    try:
        began = time.monotonic()
        dispatch = dispatching_program(
            [o.bucket for o in outcomes], [o.tuned.gm for o in outcomes], captured.inputs
        )
        if cost is not None:
            cost.record(nodes, time.monotonic() - began)
        wrong = ReferenceOutputs(captured.gm, trials, memo).check(dispatch.module())
    except Exception as exc:
        failure = failures.fallback(exc, "the dispatching program")
        wrong = f"{failure.type}: {failure.message[:300]}"
    if wrong is not None:
        return Bucketed(note=f"not bucketed: the dispatching program failed ({wrong})")
    headline = _headline(captured, outcomes, checks, by_name)
    labels = ", ".join(f"{o.bucket.describe()}: {o.bucket.name}" for o in outcomes)
    return Bucketed(outcomes, headline, dispatch, f"{len(outcomes)} buckets ({labels})")


def _headline(
    captured: Captured,
    outcomes: list[BucketOutcome],
    checks: list[Verification],
    by_name: dict[str, tuple[Candidate, Figures]],
) -> Verified:
    """The example size's bucket's decision, verified as every bucket was."""
    example = captured.spec.sizes_of(captured.inputs) if captured.spec else {}
    head = next(o for o in outcomes if o.bucket.contains(example[o.bucket.dim]))
    name = head.bucket.name
    if name == ORIGINAL:
        fig, cand = original(captured, Verdict.WITHIN_NOISE, head.bucket.reason or "")
    else:
        cand, fig = by_name[name]
        # Its verdict over the sizes it serves: elsewhere another bucket's decision runs.
        verdict_, _ = combined_verdict(head.bucket.per_size)
        why = f"the decision for {head.bucket.describe()}, one of {len(outcomes)} size buckets"
        fig = fig.model_copy(update={"verdict": verdict_, "reason": why})
    passed = all(c.passed for c in checks)
    verification = Verification(
        inputs=sum(c.inputs for c in checks),
        max_abs_error=max((c.max_abs_error or 0.0) for c in checks),
        max_rel_error=max((c.max_rel_error or 0.0) for c in checks),
        passed=passed,
        reason=None if passed else "; ".join(c.reason for c in checks if c.reason),
    )
    return Verified(fig, cand, head.tuned, head.runner, verification)


def _verify_bucket(
    program: ExportedProgram,
    captured: Captured,
    plan: Plan,
    by_name: dict[str, tuple[Candidate, Figures]],
    device: Device,
    memo: ReferenceMemo | None,
) -> tuple[BucketOutcome, Verification]:
    """A bucket's decision replayed from the original and its runner, both checked at the
    sizes measured inside the bucket; a bucket that fails runs the original instead."""
    if plan.winner == ORIGINAL:
        replay = Transformed(deep_copy(captured.gm), captured.inputs)
        check = Verification(inputs=0, max_abs_error=0.0, max_rel_error=0.0, passed=True)
        return BucketOutcome(to_bucket(plan, None), replay, captured.gm), check
    cand, fig = by_name[plan.winner]
    trials = [t for p in plan.points for t in fresh_inputs(p.inputs, 2, seed=4321)]
    gm0 = captured.gm
    replay, runner, check = replayed_and_checked(program, gm0, cand, trials, device, memo)
    wrong = check.reason
    if wrong is not None:
        check = check.model_copy(update={"reason": f"{plan.winner} at {plan.measured}: {wrong}"})
        bucket = to_bucket(dataclasses.replace(plan, winner=ORIGINAL), None)
        bucket.reason = f"{plan.winner} failed verification ({wrong}); the original runs here"
        replay = Transformed(deep_copy(gm0), captured.inputs)
        return BucketOutcome(bucket, replay, gm0), check
    package = cand.package if cand.backend == "inductor" else None
    return BucketOutcome(to_bucket(plan, fig), replay, runner, package), check
