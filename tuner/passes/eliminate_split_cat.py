"""A cat of exactly the pieces of one split, in order, is the split's input (or a reshuffle of it).

Seed 000 section 3.2 and seed 002 (atomic rule 3 of 3): after the horizontal fusions the pieces
only travel from one split to a cat, which copies them back together. Along the split's dim the
cat is the input itself; along another dim it is a reshape of the input: for pieces of size s
along dim a, cat on dim b == x.unflatten(a, (N, s)).movedim(a, b).flatten(b, b + 1). That is how
table-batched embedding rows, split per table, become the (B, N * D) concatenation.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

from torch import fx

from tuner.graph.nodes import (
    SplitPieces,
    arg,
    aten,
    is_call,
    is_symbolic,
    mutated_aliases,
    size_args,
    split_pieces,
    split_refusal,
    tensor_val,
    val,
)
from tuner.graph.sites import Site, make_site
from tuner.passes import register
from tuner.passes.base import GraphPass


@dataclass(frozen=True)
class _Match:
    cat: fx.Node
    pieces: SplitPieces
    dim: int

    def nodes(self) -> list[fx.Node]:
        return [self.cat, self.pieces.split, *self.pieces.items]


def _cat_of_split(cat: fx.Node, mutated: set[fx.Node]) -> _Match | None:
    if not is_call(cat, aten.cat.default):
        return None
    inputs = list(arg(cat, 0, "tensors"))
    if not inputs or not isinstance(inputs[0], fx.Node):
        return None
    pieces = split_pieces(inputs[0].args[0]) if is_call(inputs[0], operator.getitem) else None
    if pieces is None or list(pieces.items) != inputs:
        return None
    value = tensor_val(cat)
    if value is None:
        return None
    dim = int(arg(cat, 1, "dim", 0)) % value.dim()
    if dim != pieces.dim and len(set(pieces.sizes)) != 1:
        return None
    match = _Match(cat, pieces, dim)
    if any(n in mutated for n in [pieces.source, *match.nodes()]):
        return None
    return match


def _flattenable(sizes: list[int], strides: list[int], dim: int) -> bool:
    """Whether dims `dim` and `dim + 1` merge without a copy."""
    if sizes[dim] == 1 or sizes[dim + 1] == 1:
        return True
    return strides[dim] == strides[dim + 1] * sizes[dim + 1]


def _regroup(graph: fx.Graph, match: _Match) -> fx.Node:
    """The input with its split dim's blocks moved onto the cat dim: a view when strides allow.

    Dynamic sizes are read at run time (`size_args`); the merged dim is then -1 (every other dim
    is explicit), and with dynamic strides the copy-free check cannot be decided once, so it
    reshapes (a view when possible, a copy otherwise: right at every size).
    """
    source = match.pieces.source
    a, b = match.pieces.dim, match.dim
    count, size = len(match.pieces.sizes), match.pieces.sizes[0]
    sizes = size_args(graph, source)
    raw_strides = list(val(source).stride())
    grouped = [*sizes[:a], count, size, *sizes[a + 1 :]]
    perm = list(range(len(grouped)))
    perm.insert(b, perm.pop(a))
    moved = [grouped[p] for p in perm]
    symbolic = any(isinstance(x, fx.Node) for x in moved[b : b + 2])
    merged = -1 if symbolic else moved[b] * moved[b + 1]
    out_shape = [*moved[:b], merged, *moved[b + 2 :]]
    copy_free = False
    if not any(is_symbolic(x) for x in raw_strides) and not any(
        isinstance(x, fx.Node) for x in grouped
    ):
        strides = [int(x) for x in raw_strides]
        grouped_strides = [*strides[:a], strides[a] * size, strides[a], *strides[a + 1 :]]
        copy_free = _flattenable(moved, [grouped_strides[p] for p in perm], b)
    node = graph.call_function(aten.view.default, (source, grouped))
    node = graph.call_function(aten.permute.default, (node, perm))
    return graph.call_function(
        aten.view.default if copy_free else aten.reshape.default, (node, out_shape)
    )


@register
class EliminateSplitCat(GraphPass):
    name = "eliminate_split_cat"
    train_safe = True  # no weights: views and pointwise ops, differentiable as they were
    description = (
        "A cat of all pieces of one split, in order, becomes the split's input (same dim) or a "
        "view/permute/reshape of it (equal pieces, another dim)."
    )

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        mutated = mutated_aliases(gm)
        claimed: set[fx.Node] = set()
        sites = []
        for node in gm.graph.nodes:
            reason = split_refusal(node)
            if reason is not None:
                self.refuse(reason)
            match = _cat_of_split(node, mutated)
            if match is None or match.pieces.split in claimed:
                continue
            claimed.add(match.pieces.split)
            pieces = match.pieces
            how = "same dim" if match.dim == pieces.dim else f"dim {pieces.dim} -> {match.dim}"
            summary = f"cat of the {len(pieces.sizes)} pieces of {pieces.split.name} ({how})"
            sites.append(make_site(self.name, match.nodes(), summary))
        return sites

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        nodes = self.nodes_of(gm, site)
        cat = next(n for n in nodes if is_call(n, aten.cat.default))
        match = _cat_of_split(cat, mutated_aliases(gm))
        if match is None or set(match.nodes()) != set(nodes):
            raise LookupError(f"site {site.id} no longer matches {self.name}")
        if match.dim == match.pieces.dim:
            cat.replace_all_uses_with(match.pieces.source)
            return
        with gm.graph.inserting_before(cat):
            cat.replace_all_uses_with(_regroup(gm.graph, match))
