"""Test-only passes with known effects, to check that the tuner judges by measurement."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import fx, nn

from tuner.backends.compile_time import CompileTimes
from tuner.contract.device import Device
from tuner.graph.capture import export_module
from tuner.graph.nodes import aten, is_call
from tuner.graph.sites import Site, make_site
from tuner.host.hardware import describe, hardware_key
from tuner.measure.timing import fixed_threads
from tuner.passes import REGISTRY
from tuner.passes.base import GraphPass


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


class BuggyRelu(_ReluPass):
    """A planted bug: its rewrite raises AttributeError, as a typo in a real pass would."""

    name = "test_buggy_relu"
    description = "test only"

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        (node,) = self.nodes_of(gm, site)
        node.no_such_field.append(site)  # type: ignore[attr-defined]


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


class SplitNormTanh(nn.Module):
    """The seed's pattern at a size where fusing 24 small norms pays off on a CPU."""

    def __init__(self, n: int = 24, d: int = 16) -> None:
        super().__init__()
        self.n, self.d = n, d
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n))
        for norm in self.norms:
            nn.init.normal_(norm.weight)
            nn.init.normal_(norm.bias)
        self.out = nn.Linear(n * d, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, self.d, dim=1)
        return self.out(
            torch.cat([torch.tanh(m(p)) for m, p in zip(self.norms, pieces, strict=True)], dim=1)
        )


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


def relu_net_program() -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor]]:
    """TwoLayerReluNet with seeded small weights, exported in train mode, and its input."""
    gen = torch.Generator().manual_seed(0)
    model = TwoLayerReluNet()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    x = (torch.randn(16, 32, generator=gen),)
    return export_module(model.train(), x), x


class Reassociate(GraphPass):
    """`a @ (b @ c)` -> `(a @ b) @ c`: the same product in another order, whose cost depends on
    the batch. With x (B, D) and W (D, D), x @ (W @ W) costs D^3 + B D^2 multiply-adds and
    (x @ W) @ W costs 2 B D^2: much faster while B is well below D, slower above it. A real
    rewrite whose winner differs by size, to test size buckets on measurements."""

    name = "test_reassociate"
    description = "test only"

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        sites = []
        for n in gm.graph.nodes:
            if not is_call(n, aten.mm.default):
                continue
            inner = n.args[1]
            if is_call(inner, aten.mm.default) and len(inner.users) == 1:
                sites.append(make_site(self.name, [inner, n], f"reassociate {n.name}"))
        return sites

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        inner, outer = self.nodes_of(gm, site)
        with gm.graph.inserting_before(outer):
            first = gm.graph.call_function(aten.mm.default, (outer.args[0], inner.args[0]))
        outer.args = (first, inner.args[1])


CHAIN_WIDTH = 256


class ChainNet(nn.Module):
    """x @ (W @ W) + b: the product of the weight with itself is recomputed on every call."""

    def __init__(self, width: int = CHAIN_WIDTH) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w = nn.Parameter(torch.randn(width, width, generator=g) / width**0.5)
        self.b = nn.Parameter(torch.randn(width, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, torch.mm(self.w, self.w)) + self.b


class Associate(GraphPass):
    """`(a @ W) @ V` -> `a @ (W @ V)` for weights W, V: the reverse of `Reassociate`, faster
    once the batch is well above the width (one D^3 product instead of a second B D^2 one)."""

    name = "test_associate"
    description = "test only"

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        sites = []
        for n in gm.graph.nodes:
            if not is_call(n, aten.mm.default) or n.args[1].op != "get_attr":
                continue
            inner = n.args[0]
            if (
                is_call(inner, aten.mm.default)
                and inner.args[1].op == "get_attr"
                and len(inner.users) == 1
            ):
                sites.append(make_site(self.name, [inner, n], f"associate {n.name}"))
        return sites

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        inner, outer = self.nodes_of(gm, site)
        with gm.graph.inserting_before(outer):
            weights = gm.graph.call_function(aten.mm.default, (inner.args[1], outer.args[1]))
        outer.args = (inner.args[0], weights)


class TwoChainNet(nn.Module):
    """x @ (W @ W) + (x @ U) @ V: `Reassociate` wins on the first half at small batches,
    `Associate` on the second at large ones, and each loses where the other wins."""

    def __init__(self, width: int = CHAIN_WIDTH) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(4)
        self.w, self.u, self.v = (
            nn.Parameter(torch.randn(width, width, generator=g) / width**0.5) for _ in range(3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, torch.mm(self.w, self.w)) + torch.mm(torch.mm(x, self.u), self.v)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def _spin_alone(seconds: float) -> None:
    os.setsid()
    _spin(seconds)


@contextmanager
def busy_cores(seconds: float = 60.0, own_sessions: bool = False) -> Iterator[int]:
    """Other work on every core this process may use (one spinning process each), stopped on
    exit; yields the core count. A moment passes first so the spinners are running. With
    `own_sessions` each spinner is in a session of its own, as another user's work would be."""
    cores = len(os.sched_getaffinity(0))
    spin = _spin_alone if own_sessions else _spin
    spinners = [mp.get_context("fork").Process(target=spin, args=(seconds,)) for _ in range(cores)]
    for p in spinners:
        p.start()
    try:
        time.sleep(0.3)
        yield cores
    finally:
        for p in spinners:
            p.kill()
            p.join()


def record_compile(
    cache: Path, backend: str, nodes: int, seconds: float, threads: int | None = None
) -> Path:
    """`cache` (a decision cache) with one compile in this machine's compile history, under the
    hardware key of a run on `threads` (None: torch's default), so the run plans from it."""
    with fixed_threads(threads):
        key = hardware_key(describe(Device.parse("cpu")))
    CompileTimes.for_cache(cache).record(key, backend, nodes=nodes, seconds=seconds)
    return cache
