"""Passes in training: which may run, and that the ones that do keep the original parameters
as the trainable leaves (same state_dict, same gradients, same step)."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import pytest
from torch import fx

from examples.models import Example
from examples.training import cnn_train, export_for_training, recsys_train, transformer_train
from tuner.graph.capture import to_graph_module
from tuner.graph.nodes import TRAIN_KEY
from tuner.passes import get_pass, pass_names
from tuner.passes.apply import apply_steps
from tuner.training.step import ReferenceSteps, eager_runner

NOT_IN_TRAINING = {"remove_dropout", "fold_conv_bn", "overlap_comm_compute"}


def test_each_pass_says_whether_it_is_valid_in_training() -> None:
    unsafe = {name for name in pass_names() if not get_pass(name).train_safe}
    assert unsafe == NOT_IN_TRAINING


MODELS: dict[str, Callable[[], Example]] = {
    "recsys": lambda: recsys_train(batch=16, num_sparse=8),
    "transformer": lambda: transformer_train(batch=2, seq=16),
    "cnn": lambda: cnn_train(batch=2),
}


@functools.cache
def _exported(model: str) -> tuple[tuple, fx.GraphModule]:
    """Exported and captured once per model (recsys has 65 inputs): the tests copy."""
    example = MODELS[model]()
    program = export_for_training(example)
    return example.example_inputs, to_graph_module(program, train=True)


CASES = [
    ("recsys", "fuse_horizontal_embedding_bag"),
    ("recsys", "fuse_horizontal_linear"),
    ("recsys", "fuse_horizontal_layernorm"),
    ("transformer", "fuse_horizontal_linear"),
    ("cnn", "channels_last"),
]


@pytest.mark.parametrize(("model", "pass_name"), CASES)
def test_weight_deriving_passes_keep_the_parameters_trainable(model: str, pass_name: str) -> None:
    inputs, gm0 = _exported(model)
    tuned = apply_steps(copy.deepcopy(gm0), inputs, [(pass_name, None)])
    assert tuned.applied, f"{pass_name} found nothing to rewrite in {model}"
    assert list(tuned.gm.state_dict()) == list(gm0.state_dict())
    assert [n for n, _ in tuned.gm.named_parameters()] == [n for n, _ in gm0.named_parameters()]
    reference = ReferenceSteps(gm0, "sgd", [inputs])
    assert reference.check(eager_runner(tuned.gm, "sgd")) is None
    # The same pass at inference stores derived constants: new keys, parameters gone.
    inference = copy.deepcopy(gm0)
    inference.meta[TRAIN_KEY] = False
    frozen = apply_steps(inference, inputs, [(pass_name, None)])
    assert list(frozen.gm.state_dict()) != list(gm0.state_dict())
    assert reference.check(eager_runner(frozen.gm, "sgd")) is not None


def test_tanh_via_sigmoid_steps_like_tanh() -> None:
    """Its gradient (4 s (1 - s) through the sigmoid) is tanh's up to rounding: the step's
    outputs, gradients and updated parameters pass the reference check."""
    inputs, gm0 = _exported("recsys")
    tuned = apply_steps(copy.deepcopy(gm0), inputs, [("tanh_via_sigmoid", None)])
    assert len(tuned.applied) == 8  # one tanh per feature of the small recsys
    reference = ReferenceSteps(gm0, "sgd", [inputs])
    assert reference.check(eager_runner(tuned.gm, "sgd")) is None
