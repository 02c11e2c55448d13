import inspect
from collections.abc import Sequence
from pathlib import Path

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
from tuner.apply import Transformed
from tuner.passes.combine_sparse_inputs import SparsePacker

PASS = ["combine_sparse_inputs"]


class Ranker(nn.Module):
    """A dense input between the sparse features, one embedding bag per feature."""

    def __init__(self, rows: Sequence[int], width: int = 4, mode: str = "sum") -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(r, width, mode=mode) for r in rows)
        self.dense = nn.Linear(3, width)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        i0, o0, dense, *rest = xs
        pooled = [self.bags[0](i0, o0)]
        pooled += [
            bag(i, o) for bag, i, o in zip(self.bags[1:], rest[::2], rest[1::2], strict=True)
        ]
        return self.dense(dense) + torch.stack(pooled).sum(0)


def ranker_inputs(rows: Sequence[int], counts: Sequence[int], bags: int) -> InputMaker:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        sparse = [sparse_feature(gen, r, c, bags) for r, c in zip(rows, counts, strict=True)]
        dense = torch.randn(bags, 3, generator=gen)
        return (*sparse[0], dense, *(t for pair in sparse[1:] for t in pair))

    return make


def placeholders(result: Transformed) -> list[str]:
    return [str(n.target) for n in result.gm.graph.nodes if n.op == "placeholder"]


def test_combines_features_into_two_inputs(tmp_path: Path) -> None:
    rows, counts = [10, 7, 12], [5, 8, 3]
    module = Ranker(rows).eval()
    make = ranker_inputs(rows, counts, bags=4)
    result = assert_equivalent(module, make, PASS)
    assert len(result.applied) == 1
    assert placeholders(result) == ["sparse_indices", "sparse_offsets", "xs_2"]
    assert list(inspect.signature(result.gm.forward).parameters) == placeholders(result)
    packed = result.pack(make(torch.Generator().manual_seed(3)))
    assert [tuple(t.shape) for t in packed] == [(16,), (12,), (4, 3)]
    assert_round_trip(result, module, make, tmp_path / "combined.pt2")


def test_chains_with_table_batching(tmp_path: Path) -> None:
    rows, counts = [10, 7, 12], [5, 8, 3]
    module = Ranker(rows, mode="mean").eval()
    make = ranker_inputs(rows, counts, bags=3)
    result = assert_equivalent(module, make, [*PASS, "fuse_horizontal_embedding_bag"])
    assert [s.pass_name for s in result.applied] == [*PASS, "fuse_horizontal_embedding_bag"]
    assert_round_trip(result, module, make, tmp_path / "chained.pt2")


class SharedFeature(nn.Module):
    """One feature looked up in two tables, plus a second feature."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.EmbeddingBag(6, 4)
        self.b = nn.EmbeddingBag(6, 4, mode="max")
        self.c = nn.EmbeddingBag(9, 4)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.a(xs[0], xs[1]) + self.b(xs[0], xs[1]) + self.c(xs[2], xs[3])


def features(rows: Sequence[int], counts: Sequence[int], bags: int) -> InputMaker:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return tuple(
            t for r, c in zip(rows, counts, strict=True) for t in sparse_feature(gen, r, c, bags)
        )

    return make


def test_feature_read_by_two_tables() -> None:
    result = assert_equivalent(SharedFeature().eval(), features([6, 9], [4, 7], 2), PASS)
    assert placeholders(result) == ["sparse_indices", "sparse_offsets"]


def test_packer_keeps_other_inputs_in_order() -> None:
    inputs = tuple(torch.tensor([k]) for k in range(6))
    packed = SparsePacker(indices=(1, 4), offsets=(2, 5))(inputs)
    assert [t.tolist() for t in packed] == [[0], [1, 4], [2, 5], [3]]


class AlsoCounted(nn.Module):
    """The first feature's indices also feed a non-lookup op."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.EmbeddingBag(6, 4)
        self.b = nn.EmbeddingBag(9, 4)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        hits = (xs[0] > 2).sum().to(torch.float32)
        return self.a(xs[0], xs[1]) + self.b(xs[2], xs[3]) + hits


class SharedOffsets(nn.Module):
    """Two index inputs cut by one offsets input: no feature owns its offsets."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.EmbeddingBag(6, 4)
        self.b = nn.EmbeddingBag(9, 4)

    def forward(self, i: torch.Tensor, j: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        return self.a(i, o) + self.b(j, o)


class TwoDimensional(nn.Module):
    """2-D indices are reshaped before the lookup, so they are not a plain sparse feature."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.randn(6, 4))
        self.b = nn.Parameter(torch.randn(9, 4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.embedding_bag(x, self.a) + F.embedding_bag(y, self.b)


def unchanged(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    assert_unchanged(module.eval(), inputs, PASS)


def test_index_input_with_another_use_unchanged() -> None:
    unchanged(AlsoCounted(), features([6, 9], [4, 4], 2)(torch.Generator().manual_seed(0)))


def test_shared_offsets_unchanged() -> None:
    gen = torch.Generator().manual_seed(0)
    i, o = sparse_feature(gen, 6, 5, 2)
    j = torch.randint(0, 9, (5,), generator=gen)
    unchanged(SharedOffsets(), (i, j, o))


def test_mixed_index_dtypes_unchanged() -> None:
    gen = torch.Generator().manual_seed(0)
    first = sparse_feature(gen, 6, 4, 2, dtype=torch.int32)
    unchanged(Ranker([6, 9]), (*first, torch.randn(2, 3), *sparse_feature(gen, 9, 3, 2)))


def test_single_feature_unchanged() -> None:
    gen = torch.Generator().manual_seed(0)
    unchanged(Ranker([6]), (*sparse_feature(gen, 6, 4, 2), torch.randn(2, 3)))


def test_two_dimensional_indices_unchanged() -> None:
    unchanged(TwoDimensional(), (torch.randint(0, 6, (3, 2)), torch.randint(0, 9, (3, 4))))


@settings(max_examples=10, deadline=None)
@given(
    st.integers(2, 5).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(1, 12), min_size=n, max_size=n),
            st.lists(st.integers(0, 8), min_size=n, max_size=n),
        )
    ),
    st.integers(1, 5),
    st.integers(1, 4),
)
def test_property_equivalent(shape: tuple[list[int], list[int]], width: int, bags: int) -> None:
    rows, counts = shape
    module = Ranker(rows, width).eval()
    result = assert_equivalent(module, ranker_inputs(rows, counts, bags), PASS, trials=2)
    assert placeholders(result) == ["sparse_indices", "sparse_offsets", "xs_2"]
