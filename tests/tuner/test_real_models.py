"""Models nobody here wrote (transformers, built from configs with random weights) survive every
registered pass: same outputs, re-export, save and plain `torch.export.load`."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

from bench.zoo_models import randomize_batch_norms
from tests.passes_helpers import InputMaker, apply_every_pass, assert_round_trip, fired

transformers = pytest.importorskip("transformers")


class TensorOutputs(nn.Module):
    """transformers models return ModelOutput objects; export and the passes want plain tensors."""

    def __init__(self, model: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.keys = keys

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(*args, return_dict=True)
        return tuple(out[k] for k in self.keys)


KEYS = ("last_hidden_state", "pooler_output")


def bert(attn_implementation: str) -> tuple[nn.Module, InputMaker]:
    config = transformers.BertConfig(
        vocab_size=200,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=32,
        attn_implementation=attn_implementation,
    )
    model = TensorOutputs(transformers.BertModel(config), KEYS).eval()

    def make_inputs(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(0, config.vocab_size, (2, 16), generator=gen)
        lengths = torch.randint(4, 17, (2, 1), generator=gen)
        mask = (torch.arange(16) < lengths).long()
        return ids, mask

    return model, make_inputs


def image_inputs(size: int) -> InputMaker:
    return lambda gen: (torch.randn(2, 3, size, size, generator=gen),)


def resnet() -> tuple[nn.Module, InputMaker]:
    config = transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"
    )
    model = randomize_batch_norms(transformers.ResNetModel(config))
    return TensorOutputs(model, KEYS).eval(), image_inputs(32)


def mobilenet_v2() -> tuple[nn.Module, InputMaker]:
    config = transformers.MobileNetV2Config(image_size=16, depth_multiplier=0.35)
    model = randomize_batch_norms(transformers.MobileNetV2Model(config))
    return TensorOutputs(model, KEYS).eval(), image_inputs(16)


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
