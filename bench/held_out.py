"""Held-out models for `make bench`: transformers' BERT and ViT built from configs.

Nobody here wrote them and nothing is downloaded (random weights from the config). Sizes are
the small published shapes (bert-mini: 4 layers, hidden 256; ViT-tiny: 12 layers, hidden 192)
so a bench run stays within minutes on 2 CPU cores. Each is exported as users export them:
`torch.export` of the eval-mode model with plain tensor outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from tuner.graph.capture import export_module, save_program


class FirstOutput(nn.Module):
    """transformers returns ModelOutput objects; a `.pt2` wants plain tensors."""

    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.model(*args, return_dict=True)[self.key]


def bert_mini() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    config = transformers.BertConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        attn_implementation="sdpa",
    )
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (1, 128), generator=gen)
    mask = torch.ones(1, 128, dtype=torch.long)
    return FirstOutput(transformers.BertModel(config), "last_hidden_state").eval(), (ids, mask)


def vit_tiny() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    import transformers

    config = transformers.ViTConfig(
        hidden_size=192,
        num_hidden_layers=12,
        num_attention_heads=3,
        intermediate_size=768,
        image_size=224,
        patch_size=16,
        attn_implementation="sdpa",
    )
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    return FirstOutput(transformers.ViTModel(config), "last_hidden_state").eval(), (pixels,)


HELD_OUT: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "bert_mini": bert_mini,
    "vit_tiny": vit_tiny,
}


def build_held_out(out_dir: Path, names: list[str] | None = None) -> dict[str, Path]:
    """Export each held-out model (weights seeded) to `out_dir/<name>.pt2`."""
    paths = {}
    for name in HELD_OUT if names is None else names:
        with torch.random.fork_rng():
            torch.manual_seed(0)
            module, inputs = HELD_OUT[name]()
        paths[name] = save_program(export_module(module, inputs), out_dir / f"{name}.pt2")
    return paths
