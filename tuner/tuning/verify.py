"""Verifying the choice before it ships: replayed from the original, checked against it.

What a deployment runs is the config replayed on the original (`tuner.deploy.replay`), so that
replay is what is checked, beside the runner that was timed, on fresh inputs at every size tuned
at. A choice that fails ships the original instead, with the reason. Verifying a training step
is the training kind's (`tuner.tuning.train`); the outcomes are built here for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx
from torch.export import ExportedProgram

from tuner.contract.config import Figures, Verdict, Verification
from tuner.contract.device import Device
from tuner.deploy.replay import replay_steps
from tuner.graph.capture import Inputs
from tuner.graph.sizes import SizePoint
from tuner.measure.equivalence import ReferenceMemo, ReferenceOutputs
from tuner.measure.inputs import fresh_inputs
from tuner.passes.apply import Transformed
from tuner.tuning.candidates import Candidate
from tuner.tuning.choose import original
from tuner.tuning.run import Captured, Verified

NOTHING_TO_VERIFY = "the original program stands: nothing to verify"


def unchanged(
    captured: Captured, fig: Figures, chosen: Candidate, runner: Callable[..., Any]
) -> Verified:
    """The original was chosen: nothing was changed, so there is nothing to verify."""
    verification = Verification(
        inputs=0, max_abs_error=0.0, max_rel_error=0.0, passed=True, reason=NOTHING_TO_VERIFY
    )
    return Verified(fig, chosen, Transformed(captured.gm, captured.inputs), runner, verification)


def reverted(
    captured: Captured, runner: Callable[..., Any], verification: Verification, reason: str
) -> Verified:
    """The choice failed `verification`: the original ships (run by `runner`), and `reason`
    says why."""
    fig, chosen = original(captured, Verdict.WRONG_OUTPUTS, reason)
    replay = Transformed(captured.gm, captured.inputs)
    return Verified(fig, chosen, replay, runner, verification)


def replayed_and_checked(
    program: ExportedProgram,
    gm0: fx.GraphModule,
    cand: Candidate,
    trials: list[Inputs],
    device: Device,
    memo: ReferenceMemo | None = None,
) -> tuple[Transformed, Callable[..., Any], Verification]:
    """`cand` replayed from the original (what `apply_config` gives) and its runner, both
    checked against `gm0` on `trials` (its outputs from `memo` where it has them); the reason
    is why they differ, None when they agree."""
    replay = replay_steps(program, cand.passes)
    replay.gm.to(device.torch_device)
    runner = cand.runner if cand.runner is not None else replay.gm
    reference = ReferenceOutputs(gm0, trials, memo)  # the original's outputs, once for both
    wrong = reference.check(lambda *a: replay.gm(*replay.pack(a)))
    runner_wrong, (abs_err, rel_err) = reference.check_with_errors(
        lambda *a: runner(*replay.pack(a))
    )
    wrong = wrong or runner_wrong
    check = Verification(
        inputs=len(reference.trials),
        max_abs_error=abs_err,
        max_rel_error=rel_err,
        passed=wrong is None,
        reason=wrong,
    )
    return replay, runner, check


def verify_forward(
    program: ExportedProgram,
    captured: Captured,
    fig: Figures,
    chosen: Candidate,
    points: list[SizePoint],
    device: Device,
    memo: ReferenceMemo | None = None,
) -> Verified:
    """The config replayed from the original (eager) and the chosen runner must both match
    the original, at the example's size and every further size tuned at; else the original
    ships, with the reason."""
    trials = fresh_inputs(captured.inputs, 3, seed=1234)
    for point in points[1:]:
        trials += fresh_inputs(point.inputs, 1, seed=1234)
    replay, runner, verification = replayed_and_checked(
        program, captured.gm, chosen, trials, device, memo
    )
    wrong = verification.reason
    if wrong is not None:
        reason = f"the tuned module failed verification ({wrong}); the original stands"
        return reverted(captured, captured.gm, verification, reason)
    return Verified(fig, chosen, replay, runner, verification)
