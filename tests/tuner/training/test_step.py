"""Training steps: the loss, the step check, what may run in training (tuner.training.step)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.tuner.tuning_fixtures import (
    HalfGradRelu,
    WrongRelu,
    registered,
    relu_net_program,
)
from tuner.contract.config import TunedConfig
from tuner.contract.errors import InputError, PassError
from tuner.graph.capture import to_graph_module
from tuner.measure.equivalence import check_outputs
from tuner.measure.inputs import fresh_inputs
from tuner.passes.apply import apply_steps
from tuner.training.step import LOSS_RULE, ReferenceSteps, eager_runner, loss_of
from tuner.tuning.tuner import TuneOptions, tune_program


def test_loss_is_the_scalar_output_else_the_sum_of_output_means() -> None:
    a, b = torch.full((2, 3), 2.0), torch.full((4,), 5.0)
    assert float(loss_of((a, b))) == 7.0
    assert float(loss_of({"out": a, "loss": torch.tensor(0.25)})) == 0.25
    assert "mean" in LOSS_RULE


def test_a_gradient_breaking_rewrite_is_caught_though_the_forward_is_identical() -> None:
    program, x = relu_net_program()
    gm0 = to_graph_module(program, train=True)
    with registered(HalfGradRelu):
        planted = apply_steps(copy.deepcopy(gm0), x, [("test_half_grad_relu", None)])
    trials = [x, *fresh_inputs(x, 2)]
    # The forward check alone lets it through: the rewrite is exact in the forward.
    assert check_outputs(gm0, planted.gm, trials) is None
    for optimizer in (None, "sgd", "adamw"):
        reference = ReferenceSteps(gm0, optimizer, trials)
        assert reference.check(eager_runner(copy.deepcopy(gm0), optimizer)) is None
        wrong = reference.check(eager_runner(planted.gm, optimizer))
        assert wrong is not None and "gradient of fc1." in wrong


def test_training_refuses_passes_not_valid_in_training(tmp_path: Path) -> None:
    program, x = relu_net_program()
    gm = to_graph_module(program, train=True)
    with pytest.raises(PassError, match="not valid in a training step"):
        apply_steps(gm, x, [("remove_dropout", None)])
    # A forward-wrong pass marked unsafe (the default) is refused up front, not run.
    with registered(WrongRelu), pytest.raises(InputError, match="test_wrong_relu"):
        tune_program(
            program,
            TuneOptions(mode="train", passes=["test_wrong_relu"], backends=["eager"]),
        )
    with pytest.raises(InputError, match="optimizer"):
        TuneOptions(mode="infer", optimizer="sgd")
    with pytest.raises(InputError, match="unknown optimizer"):
        TuneOptions(mode="train", optimizer="lbfgs")


def test_old_configs_read_as_inference_configs() -> None:
    raw = {
        "schema_version": 2,
        "model_fingerprint": "f",
        "hardware": {},
        "backend": "eager",
        "passes": [],
        "sites": [],
        "candidates": [],
        "whole_model": {"name": "original", "backend": "eager", "passes": [], "verdict": "faster"},
        "verification": {"inputs": 0, "max_abs_error": 0, "max_rel_error": 0, "passed": True},
        "tuning": {},
    }
    config = TunedConfig.model_validate(raw)
    assert config.mode == "infer" and config.training is None
