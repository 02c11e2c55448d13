"""Models nobody here wrote: small transformers models built from configs with random weights,
with plain tensor outputs and a maker of their inputs. transformers is imported when a model is
built, so the modules that use these decide whether to skip without it."""

from __future__ import annotations

import torch
from torch import nn

from bench.zoo_models import randomize_batch_norms
from tests.passes_helpers import InputMaker


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
    import transformers

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
    import transformers

    config = transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic"
    )
    model = randomize_batch_norms(transformers.ResNetModel(config))
    return TensorOutputs(model, KEYS).eval(), image_inputs(32)


def mobilenet_v2() -> tuple[nn.Module, InputMaker]:
    import transformers

    config = transformers.MobileNetV2Config(image_size=16, depth_multiplier=0.35)
    model = randomize_batch_norms(transformers.MobileNetV2Model(config))
    return TensorOutputs(model, KEYS).eval(), image_inputs(16)
