"""Models nobody here wrote (transformers, built from configs with random weights) survive every
registered pass: same outputs, re-export, save and plain `torch.export.load`."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.passes_helpers import InputMaker, apply_every_pass, assert_round_trip, fired
from tests.tuner.real_models import bert, mobilenet_v2, resnet


@dataclass(frozen=True)
class RealModel:
    name: str
    build: Callable[[], tuple[nn.Module, InputMaker]]
    # pass -> the fewest sites it must rewrite here (every conv+bn pair; Q/K/V once per layer)
    expected: dict[str, int] = field(default_factory=dict)


MODELS = [
    RealModel(
        "bert-eager",
        lambda: bert("eager"),
        {"remove_dropout": 1, "fuse_horizontal_linear": 2},
    ),
    RealModel(
        "bert-sdpa",
        lambda: bert("sdpa"),
        {"remove_dropout": 1, "fuse_horizontal_linear": 2},
    ),
    RealModel("resnet", resnet, {"fold_conv_bn": 6, "channels_last": 1}),
    RealModel("mobilenet_v2", mobilenet_v2, {"fold_conv_bn": 52, "channels_last": 1}),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", MODELS, ids=lambda m: m.name)
def test_every_pass_leaves_real_model_unharmed(case: RealModel, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, make_inputs = case.build()
    result = apply_every_pass(model, make_inputs)
    assert_round_trip(result, model, make_inputs, tmp_path / "t.pt2", rtol=1e-4, atol=1e-4)
    counts = fired(result)
    print(f"{case.name}: {counts}")
    for pass_name, minimum in case.expected.items():
        assert counts.get(pass_name, 0) >= minimum, (pass_name, counts)
