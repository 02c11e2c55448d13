"""Table-batched embeddings: many same-width embedding bags become one lookup (seed 000, 2.2).

Recommendation models look up tens of small tables per batch, one kernel each, and each kernel
is mostly launch overhead. Stacking the tables row-wise (as FBGEMM's table-batched embedding
does) turns N lookups into one: each table's indices are shifted by its first row in the stack,
each feature's offsets by the number of indices before it, and the (N*B, D) result is split back
by rows. The split stays a split along dim 0 so `eliminate_split_cat` can later turn
"split + cat along dim 1" into a view.

The rewrite assumes well-formed inputs, as the batched kernels do: indices inside their own table
and offsets starting at 0 (and, with `include_last_offset`, ending at the number of indices). An
out-of-range index now reads a neighbouring table instead of raising.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from tuner.graph.nodes import (
    add_weight,
    arg,
    aten,
    attr_tensor,
    derived_weight,
    getitem_users,
    independent_groups,
    is_call,
    is_symbolic,
    is_training,
    mutated_aliases,
    tensor_val,
    topo_last,
)
from tuner.graph.sites import Site, make_site
from tuner.passes import register
from tuner.passes.base import GraphPass

EMBEDDING_BAG = aten.embedding_bag.padding_idx
INDEX_DTYPES = (torch.int64, torch.int32)


@dataclass(frozen=True)
class _Bag:
    """One embedding_bag call and the pieces of it the fused call needs."""

    node: fx.Node
    table: fx.Node
    rows: int
    indices: fx.Node
    offsets: fx.Node
    weights: fx.Node | None
    out: fx.Node

    @property
    def bags(self) -> int | torch.SymInt:
        """Bags per feature: the batch, a SymInt when the program's batch is dynamic."""
        size = _val(self.out).shape[0]
        return size if is_symbolic(size) else int(size)

    @property
    def include_last_offset(self) -> bool:
        return bool(arg(self.node, 7, "include_last_offset", False))

    def key(self, gm: fx.GraphModule) -> tuple[Any, ...]:
        """What must agree for bags to share one call: the call's flags and every dtype."""
        table = attr_tensor(gm, self.table)
        assert table is not None
        return (
            int(table.shape[1]),
            table.dtype,
            table.device,
            int(arg(self.node, 4, "mode", 0)),
            bool(arg(self.node, 3, "scale_grad_by_freq", False)),
            bool(arg(self.node, 5, "sparse", False)),
            self.weights is not None,
            self.include_last_offset,
            str(self.bags),  # the symbol's name when dynamic: equal symbols, equal batches
            _val(self.indices).dtype,
            _val(self.offsets).dtype,
        )


def _val(node: fx.Node) -> torch.Tensor:
    v = tensor_val(node)
    if v is None:
        raise ValueError(f"node {node.name} has no tensor metadata")
    return v


def _is_index_vector(node: Any) -> bool:
    v = tensor_val(node)
    return v is not None and v.dim() == 1 and v.dtype in INDEX_DTYPES


def _mutated_tables(gm: fx.GraphModule) -> set[str]:
    """Tables written in place anywhere: the stacked copy would miss the write."""
    return {str(n.target) for n in mutated_aliases(gm) if n.op == "get_attr"}


def _parse(gm: fx.GraphModule, node: fx.Node) -> _Bag | None:
    """The bag behind `node` if it can join a fused lookup, else None."""
    if not is_call(node, EMBEDDING_BAG) or arg(node, 8, "padding_idx") is not None:
        return None
    table, indices, offsets = node.args[0], arg(node, 1, "indices"), arg(node, 2, "offsets")
    weights = arg(node, 6, "per_sample_weights")
    tensor = attr_tensor(gm, table)
    if tensor is None or tensor.dim() != 2 or not tensor.is_floating_point():
        return None
    if not (_is_index_vector(indices) and _is_index_vector(offsets)):
        return None
    if weights is not None and (tensor_val(weights) is None or _val(weights).dim() != 1):
        return None
    outputs = getitem_users(node)
    if not outputs or 0 not in outputs or not outputs[0].users:
        return None
    if any(outputs[i].users for i in outputs if i != 0):
        return None
    assert isinstance(table, fx.Node) and isinstance(indices, fx.Node)
    assert isinstance(offsets, fx.Node)
    return _Bag(node, table, int(tensor.shape[0]), indices, offsets, weights, outputs[0])


def _stack_rows(bags: list[_Bag]) -> dict[str, int]:
    """First row of each distinct table in the stacked table (a shared table is stacked once)."""
    starts: dict[str, int] = {}
    total = 0
    for bag in bags:
        target = str(bag.table.target)
        if target not in starts:
            starts[target] = total
            total += bag.rows
    return starts


def _fits_dtypes(bags: list[_Bag]) -> bool:
    """Shifted int32 indices or offsets must not overflow."""
    limit = torch.iinfo(torch.int32).max
    rows = sum({str(b.table.target): b.rows for b in bags}.values())
    first = bags[0]
    if _val(first.offsets).dtype == torch.int32:
        sizes = [_val(b.indices).shape[0] for b in bags]
        if any(is_symbolic(s) for s in sizes):
            return False  # a dynamic count has no bound here: int32 offsets could overflow
        if sum(int(s) for s in sizes) > limit:
            return False
    return _val(first.indices).dtype != torch.int32 or rows <= limit


def _concat_shifted(
    gm: fx.GraphModule,
    parts: list[fx.Node],
    shifts: list[int],
    sizes: list[int],
    like: torch.Tensor,
    stem: str,
) -> fx.Node:
    """cat(parts) + each part's shift: one cat and one add with a constant, whatever N is."""
    graph = gm.graph
    joined = graph.call_function(aten.cat.default, (parts,))
    if not any(shifts):
        return joined
    shift = torch.tensor(shifts, dtype=like.dtype).repeat_interleave(torch.tensor(sizes))
    # Not in the state_dict of a training graph, which must keep the original's keys.
    name = add_weight(gm, stem, shift.to(like.device), persistent=not is_training(gm))
    shift = graph.get_attr(name)
    return graph.call_function(aten.add.Tensor, (joined, shift))


def _dynamic(bags: list[_Bag]) -> bool:
    """Whether any count or batch is a dynamic size (then shifts are computed at run time)."""
    return any(
        is_symbolic(s)
        for b in bags
        for s in (_val(b.indices).shape[0], _val(b.offsets).shape[0], _val(b.out).shape[0])
    )


def _shifted_parts(graph: fx.Graph, parts: list[fx.Node], shifts: list[Any]) -> fx.Node:
    """cat(part + shift): for dynamic sizes, where no constant shift vector can be built."""
    moved = [
        p if isinstance(s, int) and s == 0 else graph.call_function(aten.add.Tensor, (p, s))
        for p, s in zip(parts, shifts, strict=True)
    ]
    return graph.call_function(aten.cat.default, (moved,))


def _indices(gm: fx.GraphModule, bags: list[_Bag]) -> fx.Node:
    """Each feature's indices moved to its table's first row in the stack."""
    starts = _stack_rows(bags)
    shifts = [starts[str(b.table.target)] for b in bags]
    parts = [b.indices for b in bags]
    if _dynamic(bags):
        return _shifted_parts(gm.graph, parts, shifts)
    sizes = [int(_val(b.indices).shape[0]) for b in bags]
    return _concat_shifted(gm, parts, shifts, sizes, _val(parts[0]), "embedding_bag_rows")


def _offsets(gm: fx.GraphModule, bags: list[_Bag]) -> fx.Node:
    """Each feature's offsets moved past the indices of the features before it."""
    graph = gm.graph
    parts = [b.offsets for b in bags]
    if _dynamic(bags):
        # Counts are read at run time; the shift of feature k is the sum of the counts before it.
        shifts: list[Any] = [0]
        for b in bags[:-1]:
            count = graph.call_function(aten.sym_size.int, (b.indices, 0))
            prev = shifts[-1]
            total = count if prev == 0 else graph.call_function(operator.add, (prev, count))
            shifts.append(total)
        if bags[0].include_last_offset:
            parts[:-1] = [graph.call_function(aten.slice.Tensor, (p, 0, 0, -1)) for p in parts[:-1]]
        return _shifted_parts(graph, parts, shifts)
    counts = [int(_val(b.indices).shape[0]) for b in bags]
    static_shifts = [sum(counts[:k]) for k in range(len(bags))]
    n = int(bags[0].bags)
    sizes = [n] * len(bags)
    if bags[0].include_last_offset:
        # Only the last feature keeps its end offset; the others' ends are the next one's start.
        parts[:-1] = [graph.call_function(aten.slice.Tensor, (p, 0, 0, n)) for p in parts[:-1]]
        sizes[-1] = n + 1
    like = _val(bags[0].offsets)
    return _concat_shifted(gm, parts, static_shifts, sizes, like, "embedding_bag_offsets")


def _batch(graph: fx.Graph, bag: _Bag) -> int | fx.Node:
    """Bags per feature, as a split size: read from the offsets at run time when dynamic."""
    if not is_symbolic(bag.bags):
        return int(bag.bags)
    size = graph.call_function(aten.sym_size.int, (bag.offsets, 0))
    if bag.include_last_offset:
        size = graph.call_function(operator.sub, (size, 1))
    return size


@register
class FuseHorizontalEmbeddingBag(GraphPass):
    name = "fuse_horizontal_embedding_bag"
    train_safe = True  # concatenates the tables inside the graph in training
    description = (
        "Independent embedding bags of one width, mode and batch size become one lookup in a "
        "row-stacked table (table-batched embeddings)."
    )

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        mutated = _mutated_tables(gm)
        training = is_training(gm)
        buckets: dict[tuple[Any, ...], list[fx.Node]] = {}
        for node in gm.graph.nodes:
            bag = _parse(gm, node)
            if bag is None or str(bag.table.target) in mutated:
                continue
            if training and bool(arg(node, 5, "sparse", False)):
                self.refuse(f"{node.name}: sparse gradients are not fused in training")
                continue
            buckets.setdefault(bag.key(gm), []).append(node)
        sites: list[Site] = []
        for nodes in buckets.values():
            for group in independent_groups(nodes):
                bags = [b for b in (_parse(gm, n) for n in group) if b is not None]
                if _fits_dtypes(bags):
                    sites.append(make_site(self.name, group, self._summary(bags)))
        return sites

    @staticmethod
    def _summary(bags: list[_Bag]) -> str:
        rows = sum({str(b.table.target): b.rows for b in bags}.values())
        width = int(_val(bags[0].out).shape[1])
        return (
            f"{len(bags)} embedding bags ({bags[0].bags} bags each, width {width}) "
            f"-> one lookup in a ({rows}, {width}) table"
        )

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        bags = [_parse(gm, n) for n in self.nodes_of(gm, site)]
        if any(b is None for b in bags):
            raise LookupError(f"site {site.id} no longer matches {self.name}")
        found = [b for b in bags if b is not None]
        graph = gm.graph
        tables = {str(b.table.target): b.table for b in found}
        first = found[0].node
        with graph.inserting_before(topo_last([b.node for b in found])):
            # In training the stack is a per-step cat of the original tables (the leaves).
            table = derived_weight(
                gm,
                list(tables.values()),
                "embedding_bag_stacked",
                lambda: torch.cat([attr_tensor(gm, t) for t in tables.values()]),
                lambda g, nodes: g.call_function(aten.cat.default, (nodes,)),
            )
            weights = None
            if found[0].weights is not None:
                weights = graph.call_function(aten.cat.default, ([b.weights for b in found],))
            fused = graph.call_function(
                EMBEDDING_BAG,
                (
                    table,
                    _indices(gm, found),
                    _offsets(gm, found),
                    arg(first, 3, "scale_grad_by_freq", False),
                    arg(first, 4, "mode", 0),
                    arg(first, 5, "sparse", False),
                    weights,
                    found[0].include_last_offset,
                    None,
                ),
            )
            out = graph.call_function(operator.getitem, (fused, 0))
            batch = _batch(graph, found[0])
            if isinstance(batch, int):
                pieces = graph.call_function(aten.split.Tensor, (out, batch))
            else:
                # Equal symbolic sizes: split(out, B) would count its pieces as ceil(N*B / B),
                # which export cannot prove is N for every B (it pins B); sizes can be checked.
                sizes = [batch] * len(found)
                pieces = graph.call_function(aten.split_with_sizes.default, (out, sizes))
            for i, bag in enumerate(found):
                bag.out.replace_all_uses_with(graph.call_function(operator.getitem, (pieces, i)))
