"""N layer norms on the N equal pieces of one split become one norm on an (..., N, D) view.

Seed 000 section 3.2 and seed 002 (atomic rule 1 of 3): the per-piece norms cost N kernel
launches for tiny amounts of work. The affine part differs per piece, so it is kept as one
broadcast op with stacked (N, D) weights, and the result is split again so that the next rules
(`fuse_horizontal_pointwise`, `eliminate_split_cat`) still see "pieces of one split".
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import fx

from tuner.graph.nodes import (
    SPLIT_OPS,
    SplitPieces,
    arg,
    aten,
    attr_tensor,
    derived_weight,
    is_call,
    mutated_aliases,
    only_user,
    size_args,
    split_pieces,
    split_refusal,
    tensor_val,
    topo_first,
)
from tuner.graph.sites import Site, make_site
from tuner.passes import register
from tuner.passes.base import GraphPass


@dataclass(frozen=True)
class _Match:
    pieces: SplitPieces
    norms: tuple[fx.Node, ...]
    eps: float
    weights: tuple[torch.Tensor, ...] | None
    biases: tuple[torch.Tensor, ...] | None

    def nodes(self) -> list[fx.Node]:
        return [self.pieces.split, *self.pieces.items, *self.norms]


def _params(
    gm: fx.GraphModule, nodes: list[Any]
) -> tuple[torch.Tensor, ...] | Literal[False] | None:
    """Every norm's stored weight, None when no norm has one, False for a mix or a computed one."""
    if all(n is None for n in nodes):
        return None
    tensors = [attr_tensor(gm, n) for n in nodes]
    if any(t is None for t in tensors):
        return False
    return tuple(t for t in tensors if t is not None)


def _match(gm: fx.GraphModule, node: fx.Node, mutated: set[fx.Node]) -> _Match | None:
    pieces = split_pieces(node)
    if pieces is None or len(pieces.sizes) < 2 or len(set(pieces.sizes)) != 1:
        return None
    source = tensor_val(pieces.source)
    if source is None or pieces.dim != source.dim() - 1:
        return None
    norms = [only_user(item) for item in pieces.items]
    width = pieces.sizes[0]
    if not all(
        is_call(n, aten.layer_norm.default)
        and n.args[0] is item
        and list(arg(n, 1, "normalized_shape")) == [width]
        for n, item in zip(norms, pieces.items, strict=True)
    ):
        return None
    eps = {float(arg(n, 4, "eps", 1e-5)) for n in norms}
    weights = _params(gm, [arg(n, 2, "weight") for n in norms])
    biases = _params(gm, [arg(n, 3, "bias") for n in norms])
    if len(eps) != 1 or weights is False or biases is False:
        return None
    params = [*(weights or ()), *(biases or ())]
    if any(p.dtype != source.dtype or p.shape != (width,) for p in params):
        return None
    match = _Match(pieces, tuple(norms), eps.pop(), weights, biases)
    if any(n in mutated for n in [pieces.source, *match.nodes()]):
        return None
    return match


def _stacked(
    gm: fx.GraphModule, match: _Match, index: int, stem: str, tensors: tuple[torch.Tensor, ...]
) -> fx.Node:
    """The norms' weights (index 2) or biases (3) as one (N, D) tensor: a constant at
    inference, stacked in the graph per step in training (the originals stay the leaves)."""
    names = {2: "weight", 3: "bias"}
    sources = [arg(n, index, names[index]) for n in match.norms]
    return derived_weight(
        gm,
        sources,
        stem,
        lambda: torch.stack(tensors),
        lambda graph, nodes: graph.call_function(aten.stack.default, (nodes,)),
    )


def _fused(gm: fx.GraphModule, match: _Match) -> fx.Node:
    """Norm once over the (..., N, D) view, then the stacked affine; back to (..., N*D)."""
    graph = gm.graph
    pieces = match.pieces
    full = size_args(graph, pieces.source)  # a dynamic batch stays dynamic: (B, N, D), B symbolic
    grouped = [*full[:-1], len(pieces.sizes), pieces.sizes[0]]
    view = graph.call_function(aten.view.default, (pieces.source, grouped))
    out = graph.call_function(
        aten.layer_norm.default, (view, [pieces.sizes[0]], None, None, match.eps)
    )
    stem = f"{pieces.split.name}_layer_norm"
    weight = bias = None
    if match.weights is not None:
        weight = _stacked(gm, match, 2, stem + "_weight", match.weights)
    if match.biases is not None:
        bias = _stacked(gm, match, 3, stem + "_bias", match.biases)
    if weight is not None and bias is not None:
        out = graph.call_function(aten.addcmul.default, (bias, out, weight))
    elif weight is not None:
        out = graph.call_function(aten.mul.Tensor, (out, weight))
    elif bias is not None:
        out = graph.call_function(aten.add.Tensor, (out, bias))
    return graph.call_function(aten.view.default, (out, full))


@register
class FuseHorizontalLayerNorm(GraphPass):
    name = "fuse_horizontal_layernorm"
    train_safe = True  # stacks the affine parameters inside the graph in training
    description = (
        "Layer norms over the equal last-dim pieces of one split become one norm on an "
        "(..., N, D) view with stacked affine weights, split again afterwards."
    )

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        mutated = mutated_aliases(gm)
        sites = []
        for node in gm.graph.nodes:
            reason = split_refusal(node)
            if reason is not None:
                self.refuse(reason)
            match = _match(gm, node, mutated)
            if match is not None:
                n, d = len(match.pieces.sizes), match.pieces.sizes[0]
                summary = f"{n} x layer_norm([{d}]) on the pieces of {node.name}"
                sites.append(make_site(self.name, match.nodes(), summary))
        return sites

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        nodes = self.nodes_of(gm, site)
        split = next(n for n in nodes if is_call(n, *SPLIT_OPS))
        match = _match(gm, split, mutated_aliases(gm))
        if match is None or set(match.nodes()) != set(nodes):
            raise LookupError(f"site {site.id} no longer matches {self.name}")
        with gm.graph.inserting_before(topo_first(match.norms)):
            flat = _fused(gm, match)
            resplit = gm.graph.call_function(split.target, (flat, *split.args[1:]), split.kwargs)
            for i, norm in enumerate(match.norms):
                norm.replace_all_uses_with(gm.graph.call_function(operator.getitem, (resplit, i)))
