from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

from tests.passes_helpers import assert_equivalent, assert_round_trip, assert_unchanged
from tuner.graph.nodes import aten

PASS = ["eliminate_split_cat"]


class SplitCat(nn.Module):
    """x -> split along `split_dim` -> cat of every piece along `cat_dim` (scaled, to use it)."""

    def __init__(self, sizes: int | list[int], split_dim: int, cat_dim: int) -> None:
        super().__init__()
        self.sizes, self.split_dim, self.cat_dim = sizes, split_dim, cat_dim

    def pieces(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.split(x, self.sizes, dim=self.split_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.pieces(x), dim=self.cat_dim) * 2


def randn(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor]]:
    return lambda g: (torch.randn(*shape, generator=g),)


def targets(gm: fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize(("sizes", "dim"), [(2, 1), ([1, 4, 2], -1), (3, 0)])
def test_same_dim_is_the_input(sizes: int | list[int], dim: int) -> None:
    result = assert_equivalent(SplitCat(sizes, dim, dim), randn(6, 7), PASS)
    assert targets(result.gm) == [aten.mul.Tensor]


def test_embedding_rows_become_the_wide_concat() -> None:
    """Table-batched lookups: (N*B, D) rows split per table, cat on features -> (B, N*D)."""
    n, b, d = 4, 3, 5
    result = assert_equivalent(SplitCat(b, 0, 1), randn(n * b, d), PASS)
    calls = targets(result.gm)
    assert aten.cat.default not in calls
    assert aten.split.Tensor not in calls
    assert aten.permute.default in calls


@pytest.mark.parametrize(
    ("shape", "split_dim", "cat_dim"),
    [((6, 4, 2), 0, 2), ((2, 6, 3), -2, 0), ((2, 3, 8), 2, -2), ((4, 1, 6), 2, 1)],
)
def test_other_dim_is_a_regroup(shape: tuple[int, ...], split_dim: int, cat_dim: int) -> None:
    sizes = shape[split_dim] // 2
    result = assert_equivalent(SplitCat(sizes, split_dim, cat_dim), randn(*shape), PASS)
    assert aten.cat.default not in targets(result.gm)


def test_copy_free_regroup_is_a_view() -> None:
    """Moving blocks across a size-1 dim needs no copy, so the last step stays a view."""
    result = assert_equivalent(SplitCat(3, 2, 1), randn(4, 1, 6), PASS)
    assert aten.reshape.default not in targets(result.gm)


def test_non_contiguous_input() -> None:
    class Transposed(SplitCat):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x.t())

    assert_equivalent(Transposed(2, 1, 0), randn(6, 4), PASS)


def test_piece_with_other_users_keeps_the_split() -> None:
    class Shared(SplitCat):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            pieces = self.pieces(x)
            return torch.cat(pieces, dim=self.cat_dim), pieces[1].sum(0)

    result = assert_equivalent(Shared(2, 0, 0), randn(6, 3), PASS)
    calls = targets(result.gm)
    assert aten.cat.default not in calls
    assert aten.split.Tensor in calls


def test_output_may_be_the_input_itself(tmp_path: Path) -> None:
    class Identity(SplitCat):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat(self.pieces(x), dim=self.cat_dim)

    net = Identity(2, 1, 1)
    result = assert_equivalent(net, randn(3, 4), PASS)
    assert targets(result.gm) == []
    assert_round_trip(result, net, randn(3, 4), tmp_path / "id.pt2")


def test_round_trip(tmp_path: Path) -> None:
    net = SplitCat(3, 0, 1)
    result = assert_equivalent(net, randn(12, 5), PASS)
    assert_round_trip(result, net, randn(12, 5), tmp_path / "sc.pt2")


class Partial(SplitCat):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat(self.pieces(x)[:2], dim=self.cat_dim)


class Reordered(SplitCat):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = self.pieces(x)
        return torch.cat([a, c, b], dim=self.cat_dim)


class Repeated(SplitCat):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b, c = self.pieces(x)
        return torch.cat([a, b, c, a], dim=self.cat_dim)


class MutatesInputAfter(SplitCat):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat(self.pieces(x), dim=self.cat_dim)
        x.add_(1)
        return out


class MutatesCat(SplitCat):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.cat(self.pieces(x), dim=self.cat_dim)
        out[0].mul_(2)
        return out


class MutatesPiece(SplitCat):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = self.pieces(x)
        out = torch.cat(pieces, dim=self.cat_dim)
        pieces[0].add_(1)
        return out


@pytest.mark.parametrize(
    "net",
    [
        Partial(2, 1, 1),
        Reordered(2, 1, 1),
        Repeated(2, 1, 1),
        MutatesInputAfter(2, 1, 1),
        MutatesCat(2, 1, 1),
        MutatesPiece(2, 1, 1),
    ],
    ids=[
        "partial",
        "reordered",
        "repeated",
        "input-mutated",
        "cat-mutated",
        "piece-mutated",
    ],
)
def test_does_not_fire(net: nn.Module) -> None:
    assert_unchanged(net, (torch.randn(6, 6),), PASS)


@settings(max_examples=10, deadline=None)
@given(
    count=st.integers(1, 4),
    size=st.integers(1, 3),
    others=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    data=st.data(),
)
def test_property_equal_outputs(
    count: int, size: int, others: list[int], data: st.DataObject
) -> None:
    ndim = len(others) + 1
    split_dim = data.draw(st.integers(-ndim, ndim - 1), label="split_dim")
    cat_dim = data.draw(st.integers(-ndim, ndim - 1), label="cat_dim")
    shape = list(others)
    shape.insert(split_dim % ndim, count * size)
    net = SplitCat(size, split_dim, cat_dim)
    result = assert_equivalent(net, randn(*shape), PASS, trials=2)
    assert aten.cat.default not in targets(result.gm)
