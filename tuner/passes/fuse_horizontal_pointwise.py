"""The same unary pointwise op on every piece of one split runs once on the unsplit tensor.

Seed 000 section 3.2 and seed 002 (atomic rule 2 of 3): an elementwise op commutes with a split,
so N small launches become one. The result is split again the same way, which keeps the pieces
for whatever consumes them (often a cat that `eliminate_split_cat` then removes).
"""

from __future__ import annotations

import operator
from typing import Any

from torch import fx

from tuner.graph.nodes import (
    SPLIT_OPS,
    SplitPieces,
    arg,
    aten,
    is_call,
    mutated_aliases,
    only_user,
    split_pieces,
    split_refusal,
    topo_first,
)
from tuner.graph.sites import Site, make_site
from tuner.passes import register
from tuner.passes.base import GraphPass

# Out-of-place elementwise ops whose extra arguments are scalars: op(split(x)) == split(op(x)).
POINTWISE_OPS: tuple[str, ...] = (
    "tanh",
    "sigmoid",
    "relu",
    "relu6",
    "gelu",
    "silu",
    "mish",
    "elu",
    "selu",
    "celu",
    "hardtanh",
    "hardsigmoid",
    "hardswish",
    "leaky_relu",
    "softplus",
)


def _resolve(names: tuple[str, ...] | list[str]) -> set[Any]:
    ops = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is None or not hasattr(packet, "default"):
            raise ValueError(f"fuse_horizontal_pointwise: unknown aten op {name!r}")
        ops.add(packet.default)
    return ops


def _extra_args(node: fx.Node) -> tuple[Any, ...] | None:
    """Every argument after the tensor, defaults filled in; None when one is a graph value."""
    schema = node.target._schema  # type: ignore[union-attr]
    extras = []
    for i, a in enumerate(schema.arguments[1:], start=1):
        value = arg(node, i, a.name, a.default_value if a.has_default_value() else None)
        if isinstance(value, fx.Node):
            return None
        extras.append(value)
    return tuple(extras)


def _match(
    node: fx.Node, ops: set[Any], mutated: set[fx.Node]
) -> tuple[SplitPieces, list[fx.Node]] | None:
    pieces = split_pieces(node)
    if pieces is None or len(pieces.sizes) < 2:
        return None
    users = [only_user(item) for item in pieces.items]
    first = users[0]
    if not is_call(first, *ops):
        return None
    extras = _extra_args(first)
    calls: list[fx.Node] = []
    for user, item in zip(users, pieces.items, strict=True):
        if not is_call(user, first.target) or user.args[:1] != (item,):
            return None
        if extras is None or _extra_args(user) != extras:
            return None
        calls.append(user)
    if any(n in mutated for n in [pieces.source, node, *pieces.items, *calls]):
        return None
    return pieces, calls


@register
class FuseHorizontalPointwise(GraphPass):
    name = "fuse_horizontal_pointwise"
    train_safe = True  # no weights: views and pointwise ops, differentiable as they were
    description = (
        "The same unary pointwise op on every piece of one split is applied once to the split's "
        "input, which is then split again the same way."
    )
    default_options = {"ops": POINTWISE_OPS}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.ops = _resolve(self.options["ops"])

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        mutated = mutated_aliases(gm)
        sites = []
        for node in gm.graph.nodes:
            reason = split_refusal(node)
            if reason is not None:
                self.refuse(reason)
            match = _match(node, self.ops, mutated)
            if match is not None:
                pieces, calls = match
                summary = f"{len(calls)} x {calls[0].target} on the pieces of {node.name}"
                sites.append(make_site(self.name, [node, *pieces.items, *calls], summary))
        return sites

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        nodes = self.nodes_of(gm, site)
        split = next(n for n in nodes if is_call(n, *SPLIT_OPS))
        match = _match(split, self.ops, mutated_aliases(gm))
        if match is None or {split, *match[0].items, *match[1]} != set(nodes):
            raise LookupError(f"site {site.id} no longer matches {self.name}")
        pieces, calls = match
        graph = gm.graph
        with graph.inserting_before(topo_first(calls)):
            whole = graph.call_function(
                calls[0].target, (pieces.source, *calls[0].args[1:]), calls[0].kwargs
            )
            resplit = graph.call_function(split.target, (whole, *split.args[1:]), split.kwargs)
            for i, call in enumerate(calls):
                call.replace_all_uses_with(graph.call_function(operator.getitem, (resplit, i)))
