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


class HalfGradRelu(_ReluPass):
    """Forward-identical, gradient-wrong: relu's output x becomes x.detach() + (x - x.detach())
    * 0.5, which equals x exactly (x - x is 0) but halves the gradient flowing back through it."""

    name = "test_half_grad_relu"
    description = "test only"
    train_safe = True

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        (node,) = self.nodes_of(gm, site)
        users = list(node.users)
        graph = gm.graph
        with graph.inserting_after(node):
            frozen = graph.call_function(aten.detach.default, (node,))
        with graph.inserting_after(frozen):
            live = graph.call_function(aten.sub.Tensor, (node, frozen))
        with graph.inserting_after(live):
            half = graph.call_function(aten.mul.Tensor, (live, 0.5))
        with graph.inserting_after(half):
            out = graph.call_function(aten.add.Tensor, (frozen, half))
        for user in users:
            user.replace_input_with(node, out)


class TwoLayerReluNet(nn.Module):
    """A linear before the relu, so a wrong gradient through the relu reaches a parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))
