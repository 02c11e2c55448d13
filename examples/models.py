"""The example models fxtune ships: small, seeded, and shaped so that every seed pass has sites.

`recsys` follows the recommendation model of the seed posts (many embedding bags, a split into
per-feature LayerNorm + Tanh, parallel task towers); `cnn` is the conv/bn/relu case of the MKLDNN
autotuner; `transformer` has separate Q/K/V projections for horizontal linear fusion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

Inputs = tuple[torch.Tensor, ...]
InputMaker = Callable[[torch.Generator], Inputs]


@dataclass
class Example:
    """A model in eval mode with sample inputs; `make_inputs` draws fresh ones of equal shapes."""

    name: str
    module: nn.Module
    example_inputs: Inputs
    description: str
    make_inputs: InputMaker = field(repr=False)

    def fresh_inputs(self, seed: int) -> Inputs:
        return self.make_inputs(torch.Generator().manual_seed(seed))


def _randomize_batch_norms(module: nn.Module, gen: torch.Generator) -> None:
    """Give every batch norm non-trivial statistics, so folding it is not an identity."""
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
                m.weight.copy_(torch.rand(c, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.1)


def _randomize_layer_norms(module: nn.Module, gen: torch.Generator) -> None:
    """Distinct affine parameters per norm, so a stacking bug cannot hide behind ones and zeros."""
    for m in module.modules():
        if isinstance(m, nn.LayerNorm) and m.weight is not None:
            with torch.no_grad():
                m.weight.copy_(torch.rand(m.weight.shape, generator=gen) + 0.5)
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.1)


# ---------------------------------------------------------------------------------------------
# recsys


class RecSys(nn.Module):
    """DLRM-like ranking model with the seed's per-feature embedding chains and task towers."""

    def __init__(
        self,
        num_sparse: int = 32,
        num_rows: int = 1000,
        dim: int = 16,
        num_dense: int = 13,
        num_tasks: int = 4,
    ) -> None:
        super().__init__()
        self.num_sparse = num_sparse
        self.dim = dim
        self.bags = nn.ModuleList(
            nn.EmbeddingBag(num_rows, dim, mode="sum") for _ in range(num_sparse)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(num_sparse))
        self.bottom = nn.Sequential(
            nn.Linear(num_dense, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU()
        )
        self.dropout = nn.Dropout(0.1)
        width = dim * (num_sparse + 1)
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 1))
            for _ in range(num_tasks)
        )

    def forward(self, dense: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        if len(sparse) != 2 * self.num_sparse:
            raise ValueError(f"expected {2 * self.num_sparse} sparse tensors, got {len(sparse)}")
        pooled = [bag(sparse[2 * i], sparse[2 * i + 1]) for i, bag in enumerate(self.bags)]
        embedded = torch.cat(pooled, dim=1)
        pieces = torch.split(embedded, self.dim, dim=1)
        normed = torch.cat(
            [torch.tanh(norm(p)) for norm, p in zip(self.norms, pieces, strict=True)], dim=1
        )
        x = self.dropout(torch.cat([self.bottom(dense), normed], dim=1))
        return torch.sigmoid(torch.cat([tower(x) for tower in self.towers], dim=1))


def _sparse_inputs(
    gen: torch.Generator, lengths: list[torch.Tensor], num_rows: int
) -> list[torch.Tensor]:
    """Indices and offsets per feature; bag sizes are shuffled so each feature's total is fixed."""
    out: list[torch.Tensor] = []
    for feature_lengths in lengths:
        shuffled = feature_lengths[torch.randperm(len(feature_lengths), generator=gen)]
        offsets = torch.cumsum(shuffled, 0) - shuffled
        indices = torch.randint(0, num_rows, (int(shuffled.sum()),), generator=gen)
        out += [indices, offsets]
    return out


def recsys(batch: int = 256, num_sparse: int = 32) -> Example:
    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(1)
    model = RecSys(num_sparse=num_sparse)
    _randomize_layer_norms(model, gen)
    num_rows = model.bags[0].num_embeddings
    # Static shapes: the bag sizes (1-5 per sample) are fixed per feature, only their order varies.
    lengths = [torch.randint(1, 6, (batch,), generator=gen) for _ in range(model.num_sparse)]

    def make_inputs(g: torch.Generator) -> Inputs:
        dense = torch.randn(batch, 13, generator=g)
        return (dense, *_sparse_inputs(g, lengths, num_rows))

    return Example(
        "recsys",
        model.eval(),
        make_inputs(torch.Generator().manual_seed(0)),
        f"DLRM-like ranking model: {num_sparse} embedding bags -> split -> LayerNorm+Tanh -> "
        f"cat, bottom MLP, 4 parallel task towers (batch {batch})",
        make_inputs,
    )


# ---------------------------------------------------------------------------------------------
# cnn


def _conv_block(c_in: int, c_out: int, stride: int = 1, relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
    ]
    if relu:
        layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class SmallCNN(nn.Module):
    """Conv + BatchNorm + ReLU blocks with one residual connection, pooled into a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = _conv_block(3, 16)
        self.pool = nn.MaxPool2d(2)
        self.down = _conv_block(16, 32, stride=2)
        self.body = _conv_block(32, 32)
        self.body_out = _conv_block(32, 32, relu=False)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(self.pool(self.stem(x)))
        x = F.relu(x + self.body_out(self.body(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def cnn(batch: int = 8) -> Example:
    gen = torch.Generator().manual_seed(2)
    torch.manual_seed(2)
    model = SmallCNN()
    _randomize_batch_norms(model, gen)

    def make_inputs(g: torch.Generator) -> Inputs:
        return (torch.randn(batch, 3, 64, 64, generator=g),)

    return Example(
        "cnn",
        model.eval(),
        make_inputs(torch.Generator().manual_seed(0)),
        "small CNN: 4 conv+BatchNorm(+ReLU) blocks, a residual add, pooling, linear head "
        "(8x3x64x64)",
        make_inputs,
    )


# ---------------------------------------------------------------------------------------------
# transformer


class Attention(nn.Module):
    """Multi-head self-attention with separate Q, K and V projections of the same input."""

    def __init__(self, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        return x.view(b, s, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = (self._split_heads(proj(x)) for proj in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


class EncoderLayer(nn.Module):
    """Pre-norm encoder layer: attention and a GELU MLP, each on a residual branch."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, heads)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.dropout(self.mlp(self.norm2(x)))


class SmallTransformer(nn.Module):
    """Token and position embeddings, a stack of encoder layers, a final norm."""

    def __init__(
        self,
        vocab: int = 1000,
        seq: int = 64,
        d_model: int = 128,
        heads: int = 4,
        layers: int = 2,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Parameter(torch.randn(seq, d_model) * 0.02)
        self.layers = nn.ModuleList(EncoderLayer(d_model, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def transformer(batch: int = 8, seq: int = 64) -> Example:
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    model = SmallTransformer(seq=seq)
    _randomize_layer_norms(model, gen)
    vocab = model.tokens.num_embeddings

    def make_inputs(g: torch.Generator) -> Inputs:
        return (torch.randint(0, vocab, (batch, seq), generator=g),)

    return Example(
        "transformer",
        model.eval(),
        make_inputs(torch.Generator().manual_seed(0)),
        "transformer encoder: 2 pre-norm layers, d_model 128, 4 heads, separate Q/K/V linears, "
        "GELU MLP (batch 8, seq 64)",
        make_inputs,
    )


EXAMPLES: dict[str, Callable[[], Example]] = {
    "recsys": recsys,
    "cnn": cnn,
    "transformer": transformer,
}
