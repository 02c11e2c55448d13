import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.export import Dim

from tests.passes_helpers import (
    InputMaker,
    Ranker,
    assert_equivalent,
    assert_round_trip,
    assert_unchanged,
    ranker_inputs,
    sparse_feature,
)
from tuner.graph.capture import to_graph_module
from tuner.passes import get_pass
from tuner.passes.apply import Transformed, apply_passes
from tuner.passes.combine_sparse_inputs import SparsePacker

PASS = ["combine_sparse_inputs"]


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


# ------------------------------------------------------------------------------ dynamic sizes

ROWS = [10, 7, 12]
BATCH = Dim("batch", min=2, max=64)
COUNT_MAX = 5 * 64


def dynamic_inputs(batch: int, seed: int, dtype: torch.dtype = torch.int64) -> tuple[Any, ...]:
    """Ranker inputs at any batch; each feature's index count is its own size (0-4 per bag)."""
    gen = torch.Generator().manual_seed(seed)
    counts = [int(torch.randint(2, 5 * batch + 1, (1,), generator=gen)) for _ in ROWS]
    inputs = ranker_inputs(ROWS, counts, batch)(gen)
    return tuple(t.to(dtype) if t.dtype == torch.int64 else t for t in inputs)


def dynamic_program(dtype: torch.dtype = torch.int64, high: int | None = COUNT_MAX) -> Any:
    """The Ranker exported with a dynamic batch and a dynamic index count per feature."""
    torch.manual_seed(0)
    module = Ranker(ROWS).eval()
    counts = [Dim(f"count_{k}", min=2, max=high) for k in range(len(ROWS))]
    sparse = [{0: counts[0]}, {0: BATCH}, {0: BATCH}]
    for c in counts[1:]:
        sparse += [{0: c}, {0: BATCH}]
    program = torch.export.export(
        module, dynamic_inputs(8, 0, dtype), dynamic_shapes={"xs": tuple(sparse)}, strict=False
    )
    return module, program


@pytest.fixture(scope="module")
def dynamic() -> tuple[nn.Module, Any, Transformed, Any]:
    """The dynamic Ranker combined and re-exported: (eager, original, combined, its program)."""
    module, program = dynamic_program()
    result = apply_passes(program, PASS)
    assert [s.pass_name for s in result.applied] == PASS, "the pass refused a dynamic program"
    return module, program, result, result.to_program()


def _placeholder_sizes(program: Any) -> dict[str, Any]:
    return {
        n.name: n.meta["val"].shape[0]
        for n in program.graph.find_nodes(op="placeholder")
        if n.name.startswith("sparse")
    }


def test_dynamic_counts_are_combined_with_symbolic_sizes(
    dynamic: tuple[nn.Module, Any, Transformed, Any],
) -> None:
    """The combined index count is a new size whose range is the sum of the features' ranges;
    the offsets are the 3 counts plus 3 batches of offsets: 3*batch + 3, batch's range kept."""
    _, _, result, program = dynamic
    assert placeholders(result) == ["sparse_indices", "sparse_offsets", "xs_2"]
    sizes = _placeholder_sizes(program)
    indices, offsets = sizes["sparse_indices"], sizes["sparse_offsets"]
    (symbol,) = indices.node.expr.free_symbols
    ranges = {str(s): r for s, r in program.range_constraints.items()}
    assert (int(ranges[str(symbol)].lower), int(ranges[str(symbol)].upper)) == (6, 3 * COUNT_MAX)
    (batch,) = offsets.node.expr.free_symbols
    assert str(offsets.node.expr) == f"3*{batch} + 3"
    assert (int(ranges[str(batch)].lower), int(ranges[str(batch)].upper)) == (2, 64)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(2, 64), st.integers(0, 2**16))
def test_dynamic_program_equal_at_any_size(
    dynamic: tuple[nn.Module, Any, Transformed, Any], batch: int, seed: int
) -> None:
    """The re-exported program (plain `torch.export` module) and the packer at any batch and
    any index counts in range."""
    module, _, result, program = dynamic
    inputs = dynamic_inputs(batch, seed)
    with torch.no_grad():
        want = module(*inputs)
        torch.testing.assert_close(program.module()(*result.pack(inputs)), want)
        torch.testing.assert_close(result.gm(*result.pack(inputs)), want)


def test_dynamic_program_saves_and_refuses_what_it_was_not_built_for(
    dynamic: tuple[nn.Module, Any, Transformed, Any], tmp_path: Path
) -> None:
    """Loaded back with plain torch: a batch above the range raises export's guard (on the
    3*64 + 3 offsets), and packed inputs whose counts do not add up raise the in-graph check
    instead of splitting wrongly."""
    module, _, result, program = dynamic
    torch.export.save(program, tmp_path / "combined.pt2")
    loaded = torch.export.load(tmp_path / "combined.pt2").module()
    inputs = dynamic_inputs(16, 3)
    torch.testing.assert_close(loaded(*result.pack(inputs)), module(*inputs))
    with pytest.raises(AssertionError, match=r"sparse_offsets.size\(\)\[0\] <= 195"):
        loaded(*result.pack(dynamic_inputs(65, 1)))
    indices, offsets, dense = result.pack(inputs)
    wrong = offsets.clone()
    wrong[0] += 1
    for run in (loaded, result.gm):
        with pytest.raises(RuntimeError, match=r"add up|Runtime assertion failed"):
            run(indices, wrong, dense)


def test_dynamic_packer_puts_the_counts_first() -> None:
    inputs = (
        torch.arange(3),
        torch.tensor([0, 2]),
        torch.ones(1),
        torch.arange(5),
        torch.tensor([0, 1]),
    )
    packed = SparsePacker(indices=(0, 3), offsets=(1, 4), counts=True)(inputs)
    assert [t.tolist() for t in packed] == [[0, 1, 2, 0, 1, 2, 3, 4], [3, 5, 0, 2, 0, 1], [1.0]]


def test_int32_offsets_with_unbounded_counts_are_refused() -> None:
    """A count that can exceed int32 cannot ride in int32 offsets: no site, and why."""
    _, program = dynamic_program(torch.int32, high=None)
    graph_pass = get_pass(PASS[0])
    assert graph_pass.find_sites(to_graph_module(program)) == []
    assert any("could overflow" in r for r in graph_pass.refusals)
