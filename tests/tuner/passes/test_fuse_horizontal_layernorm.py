from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.passes_helpers import assert_equivalent, assert_round_trip, assert_unchanged
from tuner.graph.nodes import aten

PASS = ["fuse_horizontal_layernorm"]


def random_norm(
    d: int, eps: float = 1e-5, dtype: torch.dtype = torch.float32, **kw: bool
) -> nn.Module:
    norm = nn.LayerNorm(d, eps=eps, dtype=dtype, **kw)
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p))
    return norm


class SplitNorms(nn.Module):
    """x (..., N*D) -> split into N pieces along the last dim -> one LayerNorm per piece."""

    def __init__(self, n: int, d: int, sizes: list[int] | None = None, **norm_kw: bool) -> None:
        super().__init__()
        self.d, self.sizes = d, sizes
        widths = sizes or [d] * n
        self.norms = nn.ModuleList(random_norm(w, **norm_kw) for w in widths)

    def pieces(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(x, self.sizes or self.d, dim=-1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(norm(p) for norm, p in zip(self.norms, self.pieces(x), strict=True))


def randn(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor]]:
    return lambda g: (torch.randn(*shape, generator=g),)


def layer_norms(result_graph: str) -> int:
    return result_graph.count("aten.layer_norm.default")


@pytest.mark.parametrize("norm_kw", [{}, {"bias": False}, {"elementwise_affine": False}])
def test_fuses_norms_on_equal_pieces(norm_kw: dict[str, bool]) -> None:
    net = SplitNorms(4, 6, **norm_kw).eval()
    result = assert_equivalent(net, randn(3, 24), PASS)
    assert len(result.applied) == 1
    graph = str(result.gm.graph)
    assert layer_norms(graph) == 1
    calls = {n.target for n in result.gm.graph.nodes if n.op == "call_function"}
    assert aten.split.Tensor in calls
    assert (aten.addcmul.default in calls) == (norm_kw == {})


def test_fuses_split_with_sizes_and_leading_dims() -> None:
    net = SplitNorms(3, 5, sizes=[5, 5, 5]).eval()
    result = assert_equivalent(net, randn(2, 3, 15), PASS)
    assert layer_norms(str(result.gm.graph)) == 1


def test_single_norm_per_site_even_with_shared_weights() -> None:
    class Shared(SplitNorms):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(self.norms[0](p) for p in self.pieces(x))

    result = assert_equivalent(Shared(3, 4).eval(), randn(2, 12), PASS)
    assert layer_norms(str(result.gm.graph)) == 1


def test_non_contiguous_input() -> None:
    class Transposed(SplitNorms):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return super().forward(x.t())

    result = assert_equivalent(Transposed(3, 2).eval(), randn(6, 4), PASS)
    assert layer_norms(str(result.gm.graph)) == 1


def test_round_trip(tmp_path: Path) -> None:
    net = SplitNorms(4, 8).eval()
    result = assert_equivalent(net, randn(2, 32), PASS)
    assert_round_trip(result, net, randn(2, 32), tmp_path / "ln.pt2")


class PieceUsedTwice(SplitNorms):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pieces = self.pieces(x)
        return (*(n(p) for n, p in zip(self.norms, pieces, strict=True)), pieces[0] * 2)


class MutatesInput(SplitNorms):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = super().forward(x)
        x.add_(1)
        return out


class MutatesInputView(SplitNorms):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = super().forward(x)
        x[:, :2].mul_(2)
        return out


class MutatesNormOutput(SplitNorms):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = super().forward(x)
        out[1].mul_(2)
        return out


class AlongFirstDim(SplitNorms):
    def pieces(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(x, 2, dim=0)


class MixedAffine(SplitNorms):
    def __init__(self) -> None:
        super().__init__(2, 4)
        self.norms[1] = random_norm(4, elementwise_affine=False)


class MixedEps(SplitNorms):
    def __init__(self) -> None:
        super().__init__(2, 4)
        self.norms[1] = random_norm(4, eps=1e-3)


class MixedDtypes(SplitNorms):
    def __init__(self) -> None:
        super().__init__(2, 4, dtype=torch.bfloat16)
        self.norms[1] = random_norm(4)


@pytest.mark.parametrize(
    ("net", "x"),
    [
        (PieceUsedTwice(2, 4), torch.randn(3, 8)),
        (MutatesInput(2, 4), torch.randn(3, 8)),
        (MutatesInputView(2, 4), torch.randn(3, 8)),
        (MutatesNormOutput(2, 4), torch.randn(3, 8)),
        (SplitNorms(2, 4, sizes=[4, 6]), torch.randn(3, 10)),
        (AlongFirstDim(2, 4), torch.randn(4, 4)),
        (MixedAffine(), torch.randn(3, 8)),
        (MixedEps(), torch.randn(3, 8)),
        (MixedDtypes(), torch.randn(3, 8, dtype=torch.bfloat16)),
        (SplitNorms(2, 4), torch.randn(3, 8, dtype=torch.bfloat16)),
    ],
    ids=[
        "piece-used-twice",
        "input-mutated",
        "input-view-mutated",
        "norm-output-mutated",
        "unequal-pieces",
        "not-last-dim",
        "affine-mixed",
        "eps-differ",
        "weight-dtypes-mixed",
        "weight-dtype-differs-from-input",
    ],
)
def test_does_not_fire(net: nn.Module, x: torch.Tensor) -> None:
    assert_unchanged(net.eval(), (x,), PASS)


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(2, 5),
    d=st.integers(1, 8),
    batch=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    affine=st.booleans(),
)
def test_property_equal_outputs(n: int, d: int, batch: list[int], affine: bool) -> None:
    net = SplitNorms(n, d, elementwise_affine=affine).eval()
    result = assert_equivalent(net, randn(*batch, n * d), PASS, trials=2)
    assert layer_norms(str(result.gm.graph)) == 1
