"""Combine sparse-feature inputs: N (indices, offsets) inputs become one pair (seed 000, 3.1).

Every input tensor of a model on an accelerator is one host-to-device copy, and a copy costs a
launch more than it costs bandwidth; a model with hundreds of sparse features spends its time
copying. The caller concatenates all features' indices into one tensor and all their offsets into
another (each feature's offsets stay relative to its own indices), and the graph splits them back
with the static sizes it was exported with. Because the program's inputs change, the pass ships a
packer that turns the old inputs into the new ones.

With dynamic sizes (a dynamic batch: each feature's index count grows with it) no size of the
graph can say where one feature's indices end, so the packer also writes the features' index
counts before the offsets, and the graph reads them (one host read, `tolist`) to split the
indices: data-dependent sizes, which export keeps as unbacked symbols, with a runtime check that
they add up. The combined index count is a new dynamic size whose range is the sum of the
features' ranges; the combined offsets' length is a*batch + b of the features' batch, exported as
a derived `Dim`. A group whose offsets have different dynamic lengths is not combined (its length
would be a sum of independent sizes), nor are int32 offsets whose counts could overflow them.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import fx

from tuner.graph.capture import Inputs, set_positional_inputs
from tuner.graph.nodes import arg, aten, is_call, is_symbolic, tensor_val, topo_first
from tuner.graph.shapes import SPEC_KEY, DynamicDim, ShapeSpec, spec_of, symbol_of
from tuner.graph.sites import Site, make_site
from tuner.host.torch_compat import private, pytree
from tuner.passes import register
from tuner.passes.base import GraphPass

EMBEDDING_BAG = aten.embedding_bag.padding_idx
INDEX_DTYPES = (torch.int64, torch.int32)

Pair = tuple[fx.Node, fx.Node]


@dataclass(frozen=True)
class SparsePacker:
    """Old positional inputs -> new: the pairs' tensors leave, their concatenations take the slot
    of the first of them. Positions refer to the inputs the packer receives. With `counts`
    (dynamic sizes), the offsets start with each feature's number of indices, which the graph
    reads to split the combined indices."""

    indices: tuple[int, ...]
    offsets: tuple[int, ...]
    counts: bool = False

    def __call__(self, inputs: Inputs) -> Inputs:
        first, kept = self._layout(len(inputs))
        return (
            *inputs[:first],
            torch.cat([inputs[i] for i in self.indices]),
            torch.cat(self._offsets(inputs)),
            *[inputs[i] for i in kept],
        )

    @functools.cache  # noqa: B019 (a few packers per process, each with one input count)
    def _layout(self, count: int) -> tuple[int, tuple[int, ...]]:
        """The combined pair's slot and the positions kept after it, worked out once: `load_tuned`
        packs on every call, and this loop was a third of the packing's 20 us."""
        taken = set(self.indices) | set(self.offsets)
        first = min(taken)
        return first, tuple(p for p in range(first + 1, count) if p not in taken)

    def _offsets(self, inputs: Inputs) -> list[torch.Tensor]:
        offsets = [inputs[o] for o in self.offsets]
        if not self.counts:
            return offsets
        like = offsets[0]
        counts = [inputs[i].shape[0] for i in self.indices]
        return [torch.tensor(counts, dtype=like.dtype, device=like.device), *offsets]


def _is_index_input(node: Any) -> bool:
    v = tensor_val(node)
    return (
        isinstance(node, fx.Node)
        and node.op == "placeholder"
        and v is not None
        and v.dim() == 1
        and v.dtype in INDEX_DTYPES
    )


def _length(node: fx.Node) -> int | torch.SymInt:
    """An input's length: an int, or its SymInt when dynamic (never `int()` of one: that would
    pin the program to the example's size)."""
    v = tensor_val(node)
    assert v is not None
    size = v.shape[0]
    return size if is_symbolic(size) else int(size)


def _batch_symbol(pair: Pair) -> str | None:
    """The dynamic size the pair's offsets have (None when fixed): pairs combine only with
    pairs of the same one, so the combined offsets' length is a*batch + b."""
    size = _length(pair[1])
    return symbol_of(size) if is_symbolic(size) else None


def _uses(user: fx.Node, node: fx.Node) -> int:
    return sum(1 for a in pytree.tree_leaves((user.args, user.kwargs)) if a is node)


def _only_bag_arg(node: fx.Node, index: int, name: str) -> set[fx.Node] | None:
    """The bags using `node`, if each uses it once and only as its argument `name`."""
    bags = set(node.users)
    for user in bags:
        if not is_call(user, EMBEDDING_BAG) or arg(user, index, name) is not node:
            return None
        if _uses(user, node) != 1:
            return None
    return bags or None


def _pair_of(indices: fx.Node) -> Pair | None:
    """(indices, offsets) when both are inputs that only ever meet as one bag's pair."""
    if not _is_index_input(indices):
        return None
    bags = _only_bag_arg(indices, 1, "indices")
    if bags is None:
        return None
    partners = {arg(b, 2, "offsets") for b in bags}
    if len(partners) != 1:
        return None
    offsets = partners.pop()
    if not _is_index_input(offsets) or _only_bag_arg(offsets, 2, "offsets") != bags:
        return None
    return indices, offsets


def _key(pair: Pair) -> tuple[Any, ...]:
    indices, offsets = (tensor_val(n) for n in pair)
    assert indices is not None and offsets is not None
    return (indices.dtype, offsets.dtype, indices.device, _batch_symbol(pair))


def _is_dynamic(pairs: Sequence[Pair]) -> bool:
    return any(is_symbolic(_length(n)) for pair in pairs for n in pair)


def _count_range(spec: ShapeSpec | None, size: int | torch.SymInt) -> tuple[int, int | None]:
    """The range of one feature's index count, from the program's dynamic dims."""
    if not is_symbolic(size):
        return int(size), int(size)
    symbol = symbol_of(size)
    if spec is None or symbol not in spec.names:
        raise LookupError(f"index count {size} is not one of the program's dynamic sizes")
    dim = spec.dim(spec.names[symbol])
    return dim.min, dim.max


def _example(spec: ShapeSpec | None, size: int | torch.SymInt) -> int:
    if not is_symbolic(size):
        return int(size)
    assert spec is not None
    return spec.dim(spec.names[str(symbol_of(size))]).example


def _combined_range(spec: ShapeSpec | None, pairs: Sequence[Pair]) -> tuple[int, int | None]:
    """The combined index count's range: the sum of the features' ranges."""
    ranges = [_count_range(spec, _length(i)) for i, _ in pairs]
    tops = [hi for _, hi in ranges]
    low = sum(lo for lo, _ in ranges)
    return low, None if any(t is None for t in tops) else sum(t for t in tops if t is not None)


def _why_not(spec: ShapeSpec | None, pairs: Sequence[Pair]) -> str | None:
    """Why a dynamic group cannot be combined, or None when it can."""
    try:
        _, high = _combined_range(spec, pairs)
    except (LookupError, ValueError) as exc:
        return str(exc)
    offsets = tensor_val(pairs[0][1])
    assert offsets is not None
    if offsets.dtype == torch.int32 and (high is None or high > torch.iinfo(torch.int32).max):
        return (
            f"the offsets are {offsets.dtype} and an index count can reach {high or 'any size'}: "
            "the counts written with them could overflow"
        )
    return None


def _placeholder(graph: fx.Graph, stem: str) -> fx.Node:
    node = graph.placeholder(stem)
    node.target = node.name
    return node


def _split(graph: fx.Graph, combined: fx.Node, parts: Sequence[fx.Node]) -> None:
    sizes = [int(_length(p)) for p in parts]
    pieces = graph.call_function(aten.split_with_sizes.default, (combined, sizes))
    for i, part in enumerate(parts):
        part.replace_all_uses_with(graph.call_function(operator.getitem, (pieces, i)))


def _fresh_length(gm: fx.GraphModule, low: int, high: int | None, example: int, dtype: Any) -> Any:
    """A fake 1-D tensor whose length is a new dynamic size in [low, high], in the program's
    ShapeEnv (what export makes of a `Dim`). The symbolic-context API is torch's, not public:
    if it moved, the import fails, the rewrite raises, and the candidate is not kept."""
    shapes = private("torch.fx.experimental.symbolic_shapes")
    int_oo = private("torch.utils._sympy.numbers").int_oo
    value_ranges = private("torch.utils._sympy.value_ranges").ValueRanges

    mode = _fake_mode(gm)
    top = int_oo if high is None else high
    context = shapes.StatelessSymbolicContext(
        dynamic_sizes=[shapes.DimDynamic.DYNAMIC],
        constraint_sizes=[
            shapes.StrictMinMaxConstraint(warn_only=False, vr=value_ranges(low, top))
        ],
    )
    return mode.from_tensor(torch.empty(example, dtype=dtype), symbolic_context=context)


def _fake_mode(gm: fx.GraphModule) -> Any:
    for node in gm.graph.find_nodes(op="placeholder"):
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        if mode is not None and mode.shape_env is not None:
            return mode
    raise LookupError("the program's inputs carry no symbolic fake values")


def _fake_like(gm: fx.GraphModule, length: Any, like: torch.Tensor) -> Any:
    with _fake_mode(gm):
        return torch.empty(length, dtype=like.dtype, device=like.device)


def _batch_node(graph: fx.Graph, offsets: fx.Node, pairs: Sequence[Pair]) -> fx.Node | None:
    """The features' batch read back from the combined offsets' length (a*batch + b)."""
    lengths = [_length(o) for _, o in pairs]
    a = sum(1 for n in lengths if is_symbolic(n))
    if a == 0:
        return None
    b = len(pairs) + sum(int(n) for n in lengths if not is_symbolic(n))
    total = graph.call_function(aten.sym_size.int, (offsets, 0))
    total = graph.call_function(operator.sub, (total, b))
    return graph.call_function(operator.floordiv, (total, a)) if a > 1 else total


def _split_by_counts(
    graph: fx.Graph, indices: fx.Node, offsets: fx.Node, pairs: Sequence[Pair]
) -> None:
    """Offsets: the N counts, then each feature's offsets at fixed or batch-derived lengths.
    Indices: cut at the counts, read to the host in one `tolist`, the last piece taking the rest
    with a runtime check that it is the last count (inconsistent inputs raise, never misread)."""
    batch = _batch_node(graph, offsets, pairs)
    sizes: list[Any] = [len(pairs)]
    sizes += [batch if is_symbolic(_length(o)) else int(_length(o)) for _, o in pairs]
    pieces = graph.call_function(aten.split_with_sizes.default, (offsets, sizes))
    for k, (_, o) in enumerate(pairs):
        o.replace_all_uses_with(graph.call_function(operator.getitem, (pieces, k + 1)))
    head = graph.call_function(operator.getitem, (pieces, 0))
    listed = graph.call_method("tolist", (head,))
    counts = [graph.call_function(operator.getitem, (listed, k)) for k in range(len(pairs))]
    rest: Any = graph.call_function(aten.sym_size.int, (indices, 0))
    for count in counts[:-1]:
        rest = graph.call_function(operator.sub, (rest, count))
    same = graph.call_function(operator.eq, (counts[-1], rest))
    graph.call_function(
        aten._assert_scalar.default,
        (same, "combine_sparse_inputs: the index counts before the offsets do not add up"),
    )
    parts = graph.call_function(aten.split_with_sizes.default, (indices, [*counts[:-1], rest]))
    for k, (i, _) in enumerate(pairs):
        i.replace_all_uses_with(graph.call_function(operator.getitem, (parts, k)))


@register
class CombineSparseInputs(GraphPass):
    name = "combine_sparse_inputs"
    train_safe = True  # integer inputs only: no weight and no gradient path changes
    description = (
        "Sparse-feature inputs used only as embedding-bag (indices, offsets) pairs become one "
        "indices input and one offsets input, split back inside the graph (changes the inputs)."
    )
    changes_inputs = True

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        groups: dict[tuple[Any, ...], list[Pair]] = {}
        for node in gm.graph.find_nodes(op="placeholder"):
            try:
                pair = _pair_of(node)
                if pair is not None:
                    groups.setdefault(_key(pair), []).append(pair)
            except ValueError as exc:  # a size that is an expression of dynamic sizes
                self.refuse(f"input {node.target}: {exc}")
        sites: list[Site] = []
        spec = spec_of(gm)
        for pairs in groups.values():
            if len(pairs) < 2:
                continue
            if _is_dynamic(pairs) and (why := _why_not(spec, pairs)) is not None:
                names = ", ".join(str(i.target) for i, _ in pairs)
                self.refuse(f"inputs {names} stay apart: {why}")
                continue
            bags = [b for indices, _ in pairs for b in indices.users]
            count = sum(_length(indices) for indices, _ in pairs)
            summary = f"{len(pairs)} sparse features ({count} indices) -> 2 inputs"
            sites.append(make_site(self.name, bags, summary))
        return sites

    def _pairs(self, gm: fx.GraphModule, site: Site) -> list[Pair]:
        """The site's pairs in input order (a site names its bags, not the input names)."""
        pairs: dict[fx.Node, Pair] = {}
        for bag in self.nodes_of(gm, site):
            pair = _pair_of(arg(bag, 1, "indices"))
            if pair is None:
                raise LookupError(f"site {site.id} no longer matches {self.name}")
            pairs[pair[0]] = pair
        order = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
        return sorted(pairs.values(), key=lambda p: order[p[0]])

    def input_packer(self, gm: fx.GraphModule, site: Site) -> SparsePacker:
        position = {n: i for i, n in enumerate(gm.graph.find_nodes(op="placeholder"))}
        pairs = self._pairs(gm, site)
        return SparsePacker(
            tuple(position[i] for i, _ in pairs),
            tuple(position[o] for _, o in pairs),
            counts=_is_dynamic(pairs),
        )

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        pairs = self._pairs(gm, site)
        graph = gm.graph
        old = [n for pair in pairs for n in pair]
        dynamic = _is_dynamic(pairs)
        if dynamic:
            spec = spec_of(gm)
            if (why := _why_not(spec, pairs)) is not None:
                raise LookupError(f"site {site.id}: {why}")
            indices_val, offsets_val, packed = self._packed_values(gm, spec, pairs)
        with graph.inserting_before(topo_first(old)):
            indices = _placeholder(graph, "sparse_indices")
            offsets = _placeholder(graph, "sparse_offsets")
        last_input = list(graph.find_nodes(op="placeholder"))[-1]
        assert last_input.next is not None
        with graph.inserting_before(last_input.next):
            if dynamic:
                _split_by_counts(graph, indices, offsets, pairs)
            else:
                _split(graph, indices, [i for i, _ in pairs])
                _split(graph, offsets, [o for _, o in pairs])
        for node in old:
            graph.erase_node(node)
        if dynamic:
            indices.meta["val"], offsets.meta["val"] = indices_val, offsets_val
            assert spec is not None
            gm.meta[SPEC_KEY] = spec.with_packed(replace(packed, name=f"{indices.target}.0"))
        set_positional_inputs(gm, [str(n.target) for n in graph.find_nodes(op="placeholder")])

    @staticmethod
    def _packed_values(
        gm: fx.GraphModule, spec: ShapeSpec | None, pairs: Sequence[Pair]
    ) -> tuple[Any, Any, DynamicDim]:
        """Fake values of the combined inputs: the indices' length a new dynamic size (the
        counts are independent sizes), the offsets' length a*batch + b; and the new size."""
        low, high = _combined_range(spec, pairs)
        like_i, like_o = tensor_val(pairs[0][0]), tensor_val(pairs[0][1])
        assert like_i is not None and like_o is not None
        example = sum(_example(spec, _length(i)) for i, _ in pairs)
        indices = _fresh_length(gm, low, high, example, like_i.dtype)
        offsets = _fake_like(gm, len(pairs) + sum(_length(o) for _, o in pairs), like_o)
        symbol = symbol_of(indices.shape[0])
        assert symbol is not None
        return indices, offsets, DynamicDim(symbol, "sparse_indices.0", low, high, example)
