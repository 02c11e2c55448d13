from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.passes_helpers import assert_equivalent, assert_round_trip, assert_unchanged
from tuner.graph.capture import export_module, to_graph_module
from tuner.passes import get_pass

PASS = ["fuse_horizontal_pointwise"]
Act = Callable[[torch.Tensor], torch.Tensor]

ACTIVATIONS: dict[str, Act] = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
    "hardtanh": lambda t: F.hardtanh(t, -0.5, 0.75),
    "leaky_relu": lambda t: F.leaky_relu(t, 0.2),
    "elu": F.elu,
    "softplus": lambda t: F.softplus(t, beta=2.0),
}


class SplitAct(nn.Module):
    """x -> split along `dim` -> the same activation on every piece (each returned)."""

    def __init__(self, act: Act, sizes: int | list[int] = 3, dim: int = -1) -> None:
        super().__init__()
        self.act, self.sizes, self.dim = act, sizes, dim

    def pieces(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(x, self.sizes, dim=self.dim)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(self.act(p) for p in self.pieces(x))


def randn(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor]]:
    return lambda g: (torch.randn(*shape, generator=g),)


def calls(result_graph: str, op: str) -> int:
    return result_graph.count(f"aten.{op}.default")


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_fuses_each_activation(name: str) -> None:
    result = assert_equivalent(SplitAct(ACTIVATIONS[name]), randn(2, 9), PASS)
    assert len(result.applied) == 1
    op = name.removesuffix("_tanh")
    assert calls(str(result.gm.graph), op) == 1


def test_keeps_gelu_approximation() -> None:
    result = assert_equivalent(SplitAct(ACTIVATIONS["gelu_tanh"]), randn(2, 9), PASS)
    (gelu,) = [n for n in result.gm.graph.nodes if "gelu" in str(n.target)]
    assert gelu.kwargs == {"approximate": "tanh"}


@pytest.mark.parametrize(
    ("sizes", "dim", "shape"), [([2, 5], 1, (3, 7)), (2, 0, (5, 3, 2)), (1, -2, (2, 3, 4))]
)
def test_any_dim_and_unequal_pieces(
    sizes: int | list[int], dim: int, shape: tuple[int, ...]
) -> None:
    result = assert_equivalent(SplitAct(torch.tanh, sizes, dim), randn(*shape), PASS)
    assert calls(str(result.gm.graph), "tanh") == 1


def test_round_trip(tmp_path: Path) -> None:
    net = SplitAct(torch.sigmoid, [4, 4, 2])
    result = assert_equivalent(net, randn(3, 10), PASS)
    assert_round_trip(result, net, randn(3, 10), tmp_path / "pw.pt2")


def test_ops_option_limits_what_fires() -> None:
    gm = to_graph_module(export_module(SplitAct(torch.relu), (torch.randn(2, 6),)))
    assert get_pass(PASS[0], ops=("tanh",)).find_sites(gm) == []
    assert len(get_pass(PASS[0], ops=("relu",)).find_sites(gm)) == 1
    with pytest.raises(ValueError, match="not_an_op"):
        get_pass(PASS[0], ops=("not_an_op",))


class MixedOps(SplitAct):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b = self.pieces(x)
        return torch.tanh(a), torch.sigmoid(b)


class MixedArgs(SplitAct):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b = self.pieces(x)
        return F.leaky_relu(a, 0.1), F.leaky_relu(b, 0.2)


class PieceUsedTwice(SplitAct):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pieces = self.pieces(x)
        return (*(self.act(p) for p in pieces), pieces[0] + 1)


class MutatesPiece(SplitAct):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = super().forward(x)
        self.pieces(x)[1].add_(1)
        return out


class MutatesInput(SplitAct):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = super().forward(x)
        x.add_(1)
        return out


class MutatesOutput(SplitAct):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = super().forward(x)
        out[0].add_(1)
        return out


class InPlaceAct(SplitAct):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.relu_(p) for p in self.pieces(x))


class OnePiece(SplitAct):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, b = self.pieces(x)
        return torch.tanh(a), b


@pytest.mark.parametrize(
    "net",
    [
        MixedOps(torch.tanh),
        MixedArgs(torch.tanh),
        PieceUsedTwice(torch.tanh),
        MutatesPiece(torch.tanh),
        MutatesInput(torch.tanh),
        MutatesOutput(torch.tanh),
        InPlaceAct(torch.tanh),
        OnePiece(torch.tanh),
        SplitAct(torch.exp),
    ],
    ids=[
        "mixed-ops",
        "mixed-args",
        "piece-used-twice",
        "piece-mutated",
        "input-mutated",
        "output-mutated",
        "in-place-op",
        "piece-without-op",
        "op-not-listed",
    ],
)
def test_does_not_fire(net: nn.Module) -> None:
    assert_unchanged(net, (torch.randn(2, 6),), PASS)


@settings(max_examples=10, deadline=None)
@given(
    name=st.sampled_from(sorted(ACTIVATIONS)),
    sizes=st.lists(st.integers(1, 4), min_size=2, max_size=5),
    batch=st.integers(1, 3),
    dim=st.sampled_from([0, 1, -1]),
)
def test_property_equal_outputs(name: str, sizes: list[int], batch: int, dim: int) -> None:
    shape = [batch, 2, 2]
    shape[dim] = sum(sizes)
    result = assert_equivalent(
        SplitAct(ACTIVATIONS[name], sizes, dim), randn(*shape), PASS, trials=2
    )
    assert len(result.applied) == 1
