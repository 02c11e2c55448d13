"""Example programs exported the way models are deployed: with a dynamic batch (`Dim`).

`mlp_split` is issue 9's case (a tuned copy used to serve batch 32 only); `recsys` is the
shipped recsys example with its batch and every feature's index count dynamic.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from examples.models import Inputs, RecSys, _randomize_layer_norms, _sparse_inputs

BATCH_MIN, BATCH_MAX = 2, 4096


class MLPSplit(nn.Module):
    """Linear -> split into 8 pieces -> LayerNorm + tanh each -> cat -> Linear (256 wide)."""

    def __init__(self, d_in: int = 64, pieces: int = 8, width: int = 32, d_out: int = 256) -> None:
        super().__init__()
        self.width = width
        self.inp = nn.Linear(d_in, pieces * width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(pieces))
        self.out = nn.Linear(pieces * width, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.split(self.inp(x), self.width, dim=1)
        normed = [torch.tanh(norm(p)) for norm, p in zip(self.norms, parts, strict=True)]
        return self.out(torch.cat(normed, dim=1))


def mlp_split(batch: int = 32) -> tuple[nn.Module, ExportedProgram]:
    """The eager model and its program with `Dim("batch", min=2, max=4096)`."""
    torch.manual_seed(9)
    model = MLPSplit().eval()
    _randomize_layer_norms(model, torch.Generator().manual_seed(9))
    x = torch.randn(batch, 64, generator=torch.Generator().manual_seed(0))
    batch_dim = Dim("batch", min=BATCH_MIN, max=BATCH_MAX)
    program = torch.export.export(model, (x,), dynamic_shapes={"x": {0: batch_dim}}, strict=False)
    return model, program


def mlp_inputs(batch: int, seed: int = 0) -> Inputs:
    return (torch.randn(batch, 64, generator=torch.Generator().manual_seed(seed)),)


def recsys(
    batch: int = 64, num_sparse: int = 8
) -> tuple[nn.Module, ExportedProgram, Callable[[int, int], Inputs]]:
    """The recsys model with a dynamic batch (offsets and dense rows) and dynamic index counts.

    Returns the eager model, its program, and `make(batch, seed)` for inputs at any batch.
    """
    torch.manual_seed(1)
    model = RecSys(num_sparse=num_sparse).eval()
    _randomize_layer_norms(model, torch.Generator().manual_seed(1))
    rows = model.bags[0].num_embeddings

    def make(b: int, seed: int = 0) -> Inputs:
        g = torch.Generator().manual_seed(seed)
        lengths = [torch.randint(1, 6, (b,), generator=g) for _ in range(num_sparse)]
        return (torch.randn(b, 13, generator=g), *_sparse_inputs(g, lengths, rows))

    batch_dim = Dim("batch", min=BATCH_MIN, max=BATCH_MAX)
    sparse = []
    for i in range(num_sparse):
        sparse += [{0: Dim(f"indices_{i}", min=2, max=5 * BATCH_MAX)}, {0: batch_dim}]
    program = torch.export.export(
        model,
        make(batch),
        dynamic_shapes={"dense": {0: batch_dim}, "sparse": tuple(sparse)},
        strict=False,
    )
    return model, program, make
