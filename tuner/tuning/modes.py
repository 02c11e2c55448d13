"""What each tuning mode tunes: `Mode` -> its step kind (`tuner.tuning.step_kind.StepKind`)."""

from __future__ import annotations

from tuner.contract.config import Mode
from tuner.tuning.inference import InferenceStep
from tuner.tuning.step_kind import StepKind
from tuner.tuning.train import TrainingStep

STEP_KINDS: dict[Mode, type[StepKind]] = {kind.mode: kind for kind in (InferenceStep, TrainingStep)}


def step_kind_for(mode: Mode) -> type[StepKind]:
    return STEP_KINDS[mode]
