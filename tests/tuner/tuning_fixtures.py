"""Test-only passes with known effects, to check that the tuner judges by measurement."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import fx, nn

from tuner.graph import aten, is_call
from tuner.passes import REGISTRY
from tuner.passes.base import GraphPass
from tuner.sites import Site, make_site


class _ReluPass(GraphPass):
    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        return [
            make_site(self.name, [n], f"relu {n.name}")
            for n in gm.graph.nodes
            if is_call(n, aten.relu.default)
        ]


class SlowRelu(_ReluPass):
    """Correct but about 60x slower: relu applied again and again (relu is idempotent)."""

    name = "test_slow_relu"
    description = "test only"

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        (node,) = self.nodes_of(gm, site)
        users = list(node.users)
        current = node
        for _ in range(60):
            with gm.graph.inserting_after(current):
                current = gm.graph.call_function(aten.relu.default, (current,))
        for user in users:
            user.replace_input_with(node, current)


class WrongRelu(_ReluPass):
    """Fast but wrong: relu becomes sigmoid."""

    name = "test_wrong_relu"
    description = "test only"

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        (node,) = self.nodes_of(gm, site)
        node.target = aten.sigmoid.default


@contextmanager
def registered(*classes: type[GraphPass]) -> Iterator[None]:
    for cls in classes:
        REGISTRY[cls.name] = cls
    try:
        yield
    finally:
        for cls in classes:
            REGISTRY.pop(cls.name, None)


class ReluNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(x))
