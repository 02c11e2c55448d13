"""Dropout is the identity at inference: drop the call (seed 001, "dropout removal")."""

from __future__ import annotations

from torch import fx

from tuner.graph.nodes import arg, aten, is_call
from tuner.graph.sites import Site, make_site
from tuner.passes import register
from tuner.passes.base import GraphPass


@register
class RemoveDropout(GraphPass):
    name = "remove_dropout"
    description = "Remove dropout calls whose train flag is False (inference graphs)."
    # A training step of a program exported in eval mode would still train without dropout,
    # which changes what is trained, not only how fast: never in training.
    train_safe = False

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        return [
            make_site(self.name, [n], f"dropout(p={arg(n, 1, 'p')}) on {n.args[0]}")
            for n in gm.graph.nodes
            if is_call(n, aten.dropout.default) and arg(n, 2, "train") is False
        ]

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        (node,) = self.nodes_of(gm, site)
        node.replace_all_uses_with(node.args[0])
        gm.graph.erase_node(node)
