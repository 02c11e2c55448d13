from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.passes_helpers import (
    InputMaker,
    assert_equivalent,
    assert_round_trip,
    assert_unchanged,
    sparse_feature,
)
from tuner.graph.nodes import aten
from tuner.passes.apply import Transformed

PASS = ["fuse_horizontal_embedding_bag"]


class Bags(nn.Module):
    """One embedding bag per sparse feature; forward takes (indices, offsets) per feature."""

    def __init__(
        self,
        rows: Sequence[int],
        widths: Sequence[int],
        modes: Sequence[str] | str = "sum",
        include_last_offset: bool = False,
        dtypes: Sequence[torch.dtype] | None = None,
    ) -> None:
        super().__init__()
        modes = [modes] * len(rows) if isinstance(modes, str) else modes
        dtypes = dtypes or [torch.float32] * len(rows)
        self.bags = nn.ModuleList(
            nn.EmbeddingBag(r, d, mode=m, include_last_offset=include_last_offset, dtype=t)
            for r, d, m, t in zip(rows, widths, modes, dtypes, strict=True)
        )

    def forward(self, *features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pairs = zip(features[::2], features[1::2], strict=True)
        return tuple(bag(i, o) for bag, (i, o) in zip(self.bags, pairs, strict=True))


def features(
    rows: Sequence[int],
    counts: Sequence[int],
    bags: int,
    include_last_offset: bool = False,
    dtype: torch.dtype = torch.int64,
) -> InputMaker:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        out: list[torch.Tensor] = []
        for r, c in zip(rows, counts, strict=True):
            out += sparse_feature(gen, r, c, bags, include_last_offset, dtype)
        return tuple(out)

    return make


def lookups(result: Transformed) -> list[torch.fx.Node]:
    return list(
        result.gm.graph.find_nodes(op="call_function", target=aten.embedding_bag.padding_idx)
    )


def test_fuses_tables_of_one_width(tmp_path: Path) -> None:
    rows, counts = [10, 7, 13], [6, 9, 4]
    module = Bags(rows, [4, 4, 4]).eval()
    make = features(rows, counts, bags=3)
    result = assert_equivalent(module, make, PASS)
    assert len(result.applied) == 1
    (fused,) = lookups(result)
    assert tuple(fused.args[0].meta["val"].shape) == (30, 4)
    splits = result.gm.graph.find_nodes(op="call_function", target=aten.split.Tensor)
    assert len(splits) == 1 and splits[0].args[1] == 3
    assert_round_trip(result, module, make, tmp_path / "fused.pt2")


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_modes_and_last_offset(mode: str, include_last_offset: bool) -> None:
    rows, counts = [9, 11], [7, 5]
    module = Bags(rows, [3, 3], mode, include_last_offset).eval()
    result = assert_equivalent(module, features(rows, counts, 4, include_last_offset), PASS)
    assert len(lookups(result)) == 1


def test_int32_indices() -> None:
    rows, counts = [5, 6], [4, 4]
    module = Bags(rows, [2, 2]).eval()
    result = assert_equivalent(module, features(rows, counts, 2, dtype=torch.int32), PASS)
    assert len(lookups(result)) == 1


class Weighted(nn.Module):
    def __init__(self, with_weights: Sequence[bool]) -> None:
        super().__init__()
        self.with_weights = list(with_weights)
        self.bags = nn.ModuleList(nn.EmbeddingBag(8, 4, mode="sum") for _ in with_weights)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = []
        for k, (bag, weighted) in enumerate(zip(self.bags, self.with_weights, strict=True)):
            i, o, w = xs[3 * k : 3 * k + 3]
            out.append(bag(i, o, per_sample_weights=w if weighted else None))
        return tuple(out)


def weighted_features(n: int, count: int = 5) -> InputMaker:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        out: list[torch.Tensor] = []
        for _ in range(n):
            out += [*sparse_feature(gen, 8, count, 3), torch.rand(count, generator=gen)]
        return tuple(out)

    return make


def test_per_sample_weights_fuse_when_all_have_them() -> None:
    result = assert_equivalent(Weighted([True, True]).eval(), weighted_features(2), PASS)
    assert len(lookups(result)) == 1


def test_per_sample_weights_on_some_bags_only() -> None:
    module = Weighted([True, False]).eval()
    assert_unchanged(module, weighted_features(2)(torch.Generator().manual_seed(0)), PASS)


class Functional2d(nn.Module):
    """`F.embedding_bag` on 2-D input exports as a reshape plus `arange` offsets."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(11, 5))
        self.b = nn.Parameter(torch.randn(6, 5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(x, self.a) + F.embedding_bag(y, self.b)


def test_two_dimensional_input() -> None:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        x = torch.randint(0, 11, (4, 3), generator=gen)
        return x, torch.randint(0, 6, (4, 2), generator=gen)

    result = assert_equivalent(Functional2d().eval(), make, PASS)
    assert len(lookups(result)) == 1


class SharedTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.EmbeddingBag(9, 4)
        self.other = nn.EmbeddingBag(5, 4)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.shared(xs[0], xs[1]) * self.shared(xs[2], xs[3]) - self.other(xs[4], xs[5])


def test_shared_table_is_stacked_once() -> None:
    make = features([9, 9, 5], [4, 6, 3], bags=2)
    result = assert_equivalent(SharedTable().eval(), make, PASS)
    (fused,) = lookups(result)
    assert tuple(fused.args[0].meta["val"].shape) == (14, 4)


def test_fuses_only_the_matching_subset() -> None:
    rows, counts = [6, 7, 8], [3, 3, 3]
    module = Bags(rows, [4, 4, 2]).eval()
    result = assert_equivalent(module, features(rows, counts, 2), PASS)
    assert len(result.applied) == 1
    assert sorted(tuple(n.args[0].meta["val"].shape) for n in lookups(result)) == [(8, 2), (13, 4)]


def unchanged(module: nn.Module, make: InputMaker) -> None:
    assert_unchanged(module.eval(), make(torch.Generator().manual_seed(0)), PASS)


def test_mixed_widths_unchanged() -> None:
    unchanged(Bags([6, 7], [4, 3]), features([6, 7], [3, 3], 2))


def test_mixed_table_dtypes_unchanged() -> None:
    module = Bags([6, 7], [4, 4], dtypes=[torch.float32, torch.float64])
    unchanged(module, features([6, 7], [3, 3], 2))


def test_mixed_modes_unchanged() -> None:
    unchanged(Bags([6, 7], [4, 4], ["sum", "mean"]), features([6, 7], [3, 3], 2))


def test_mixed_batch_sizes_unchanged() -> None:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (*sparse_feature(gen, 6, 4, 2), *sparse_feature(gen, 7, 4, 3))

    unchanged(Bags([6, 7], [4, 4]), make)


def test_mixed_index_dtypes_unchanged() -> None:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        first = sparse_feature(gen, 6, 4, 2, dtype=torch.int32)
        return (*first, *sparse_feature(gen, 7, 4, 2))

    unchanged(Bags([6, 7], [4, 4]), make)


class Mutating(nn.Module):
    """Writes into one table after reading it: a stacked copy would miss the write."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("a", torch.randn(6, 4))
        self.register_buffer("b", torch.randn(7, 4))

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = F.embedding_bag(xs[0], self.a, xs[1]), F.embedding_bag(xs[2], self.b, xs[3])
        self.b[0].add_(1.0)
        return out


def test_mutated_table_unchanged() -> None:
    unchanged(Mutating(), features([6, 7], [3, 3], 2))


class PaddingIdx(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.EmbeddingBag(6, 4, padding_idx=0)
        self.b = nn.EmbeddingBag(7, 4, padding_idx=0)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.a(xs[0], xs[1]), self.b(xs[2], xs[3])


def test_padding_idx_unchanged() -> None:
    unchanged(PaddingIdx(), features([6, 7], [3, 3], 2))


class Dependent(nn.Module):
    """The second lookup's indices come from the first one's output."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.EmbeddingBag(6, 4)
        self.b = nn.EmbeddingBag(6, 4)

    def forward(self, i: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        first = self.a(i, o)
        chosen = first.argmax(dim=1)
        return self.b(chosen, torch.arange(chosen.shape[0]))


def test_dependent_lookups_unchanged() -> None:
    unchanged(Dependent(), features([6], [5], 3))


class UsesOffset2Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(6, 4))
        self.b = nn.Parameter(torch.randn(7, 4))

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out_a, offset2bag, _, _ = torch.embedding_bag(
            self.a, xs[0], xs[1], False, 0, False, None, False, None
        )
        out_b = F.embedding_bag(xs[2], self.b, xs[3], mode="sum")
        return out_a, out_b, offset2bag


def test_used_offset2bag_unchanged() -> None:
    unchanged(UsesOffset2Bag(), features([6, 7], [3, 3], 2))


@settings(max_examples=10, deadline=None)
@given(
    st.integers(2, 4).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(1, 12), min_size=n, max_size=n),
            st.lists(st.integers(0, 8), min_size=n, max_size=n),
        )
    ),
    st.integers(1, 6),
    st.integers(1, 4),
    st.sampled_from(["sum", "mean", "max"]),
    st.booleans(),
)
def test_property_equivalent(
    shape: tuple[list[int], list[int]], width: int, bags: int, mode: str, last: bool
) -> None:
    rows, counts = shape
    module = Bags(rows, [width] * len(rows), mode, last).eval()
    result = assert_equivalent(module, features(rows, counts, bags, last), PASS, trials=2)
    (fused,) = lookups(result)
    assert tuple(fused.args[0].meta["val"].shape) == (sum(rows), width)
