"""Combine sparse-feature inputs: N (indices, offsets) inputs become one pair (seed 000, 3.1).

Every input tensor of a model on an accelerator is one host-to-device copy, and a copy costs a
launch more than it costs bandwidth; a model with hundreds of sparse features spends its time
copying. The caller concatenates all features' indices into one tensor and all their offsets into
another (each feature's offsets stay relative to its own indices), and the graph splits them back
with the static sizes it was exported with. Because the program's inputs change, the pass ships a
packer that turns the old inputs into the new ones.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from tuner.capture import Inputs, set_positional_inputs
from tuner.graph import arg, aten, is_call, tensor_val, topo_first
from tuner.passes import register
from tuner.passes.base import GraphPass
from tuner.sites import Site, make_site

EMBEDDING_BAG = aten.embedding_bag.padding_idx
INDEX_DTYPES = (torch.int64, torch.int32)

Pair = tuple[fx.Node, fx.Node]


@dataclass(frozen=True)
class SparsePacker:
    """Old positional inputs -> new: the pairs' tensors leave, their concatenations take the slot
    of the first of them. Positions refer to the inputs the packer receives."""

    indices: tuple[int, ...]
    offsets: tuple[int, ...]

    def __call__(self, inputs: Inputs) -> Inputs:
        taken = set(self.indices) | set(self.offsets)
        first = min(taken)
        packed: list[Any] = []
        for position, value in enumerate(inputs):
            if position == first:
                packed.append(torch.cat([inputs[i] for i in self.indices]))
                packed.append(torch.cat([inputs[i] for i in self.offsets]))
            elif position not in taken:
                packed.append(value)
        return tuple(packed)


def _is_index_input(node: Any) -> bool:
    v = tensor_val(node)
    return (
        isinstance(node, fx.Node)
        and node.op == "placeholder"
        and v is not None
        and v.dim() == 1
        and v.dtype in INDEX_DTYPES
        and isinstance(v.shape[0], int)
    )


def _dynamic_bag_input(node: fx.Node) -> bool:
    """An index vector of dynamic length read by an embedding bag."""
    v = tensor_val(node)
    return (
        v is not None
        and v.dim() == 1
        and v.dtype in INDEX_DTYPES
        and not isinstance(v.shape[0], int)
        and any(is_call(u, EMBEDDING_BAG) for u in node.users)
    )


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
    return (indices.dtype, offsets.dtype, indices.device)


def _numel(node: fx.Node) -> int:
    v = tensor_val(node)
    assert v is not None
    return int(v.shape[0])


def _placeholder(graph: fx.Graph, stem: str) -> fx.Node:
    node = graph.placeholder(stem)
    node.target = node.name
    return node


def _split(graph: fx.Graph, combined: fx.Node, parts: Sequence[fx.Node]) -> None:
    sizes = [_numel(p) for p in parts]
    pieces = graph.call_function(aten.split_with_sizes.default, (combined, sizes))
    for i, part in enumerate(parts):
        part.replace_all_uses_with(graph.call_function(operator.getitem, (pieces, i)))


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
            if _dynamic_bag_input(node):
                self.refuse(
                    f"input {node.target} has a dynamic size: the graph could not split the "
                    "packed inputs back (their sizes would be data), so sparse inputs stay apart"
                )
                continue
            pair = _pair_of(node)
            if pair is not None:
                groups.setdefault(_key(pair), []).append(pair)
        sites: list[Site] = []
        for pairs in groups.values():
            if len(pairs) < 2:
                continue
            bags = [b for indices, _ in pairs for b in indices.users]
            count = sum(_numel(indices) for indices, _ in pairs)
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
            tuple(position[i] for i, _ in pairs), tuple(position[o] for _, o in pairs)
        )

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        pairs = self._pairs(gm, site)
        graph = gm.graph
        old = [n for pair in pairs for n in pair]
        with graph.inserting_before(topo_first(old)):
            indices = _placeholder(graph, "sparse_indices")
            offsets = _placeholder(graph, "sparse_offsets")
        last_input = list(graph.find_nodes(op="placeholder"))[-1]
        assert last_input.next is not None
        with graph.inserting_before(last_input.next):
            _split(graph, indices, [i for i, _ in pairs])
            _split(graph, offsets, [o for _, o in pairs])
        for node in old:
            graph.erase_node(node)
        set_positional_inputs(gm, [str(n.target) for n in graph.find_nodes(op="placeholder")])
