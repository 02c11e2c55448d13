"""Seed 000 section 3.2 through the three atomic rules of seed 002, chained.

x (B, N*D) -> split into N -> LayerNorm_i -> Tanh -> cat -> Linear. The seed counts 2N+3 kernels
before and 5 after (add_middle_dim, norm, tanh, remove_middle_dim, the linear).
"""

import operator
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

from tests.passes_helpers import (
    assert_equivalent,
    assert_round_trip,
    assert_unchanged,
    fired,
    transform,
)
from tuner.graph.nodes import aten
from tuner.passes.apply import count_ops

CHAIN = ["fuse_horizontal_layernorm", "fuse_horizontal_pointwise", "eliminate_split_cat"]
VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "gelu": F.gelu,
}


class SplitNormActCat(nn.Module):
    def __init__(self, n: int = 8, d: int = 16, act: str = "tanh", out: int = 4) -> None:
        super().__init__()
        self.d, self.act = d, ACTIVATIONS[act]
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(n))
        self.fc = nn.Linear(n * d, out)
        with torch.no_grad():
            for p in self.norms.parameters():
                p.copy_(torch.randn_like(p))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pieces = torch.split(x, self.d, dim=-1)
        outs = [self.act(norm(p)) for norm, p in zip(self.norms, pieces, strict=True)]
        return self.fc(torch.cat(outs, dim=-1))


def randn(*shape: int) -> Callable[[torch.Generator], tuple[torch.Tensor]]:
    return lambda g: (torch.randn(*shape, generator=g),)


def kernels(gm: fx.GraphModule) -> int:
    """Aten calls that launch work: getitem and pure views excluded."""
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem and n.target not in VIEWS
    )


def between_input_and_linear(gm: fx.GraphModule) -> list[object]:
    return [
        n.target
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not aten.linear.default
    ]


def test_seed_model_chain() -> None:
    n, d = 8, 16
    net = SplitNormActCat(n, d).eval()
    before = transform(net, (torch.randn(2, n * d),), [])
    result = assert_equivalent(net, randn(2, n * d), CHAIN)
    assert fired(result) == dict.fromkeys(CHAIN, 1)
    middle = between_input_and_linear(result.gm)
    assert middle.count(aten.layer_norm.default) == 1
    assert middle.count(aten.tanh.default) == 1
    assert set(middle) <= {aten.layer_norm.default, aten.tanh.default, aten.addcmul.default, *VIEWS}
    (linear,) = [n for n in result.gm.graph.nodes if n.target is aten.linear.default]
    assert linear.args[0].target is aten.tanh.default
    k_before, k_after, with_views = kernels(before.gm), kernels(result.gm), count_ops(result.gm)
    print(
        f"kernels before {k_before} (2N+3 = {2 * n + 3}), after {k_after} ({with_views} with views)"
    )
    assert (k_before, k_after, with_views) == (2 * n + 3, 4, 6)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_every_prefix_of_the_chain_is_exact(steps: int) -> None:
    result = assert_equivalent(SplitNormActCat(4, 8).eval(), randn(3, 32), CHAIN[:steps])
    assert fired(result) == dict.fromkeys(CHAIN[:steps], 1)


@pytest.mark.parametrize("name", CHAIN[1:])
def test_later_rules_alone_find_nothing_on_the_seed_model(name: str) -> None:
    """Pointwise and split-cat need the pieces the norm rule re-creates; alone they stay put."""
    assert_unchanged(SplitNormActCat(4, 8).eval(), (torch.randn(3, 32),), [name])


def test_round_trip(tmp_path: Path) -> None:
    net = SplitNormActCat(4, 8).eval()
    result = assert_equivalent(net, randn(3, 32), CHAIN)
    assert_round_trip(result, net, randn(3, 32), tmp_path / "chain.pt2")


def test_mutated_input_stops_the_chain() -> None:
    class Mutating(SplitNormActCat):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out = super().forward(x)
            x.mul_(2)
            return out

    assert_unchanged(Mutating(4, 8).eval(), (torch.randn(3, 32),), CHAIN)


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(2, 5),
    d=st.integers(2, 6),
    batch=st.integers(1, 4),
    act=st.sampled_from(sorted(ACTIVATIONS)),
)
def test_property_chain_equal_outputs(n: int, d: int, batch: int, act: str) -> None:
    net = SplitNormActCat(n, d, act).eval()
    result = assert_equivalent(net, randn(batch, n * d), CHAIN, trials=2, rtol=1e-4, atol=1e-5)
    assert fired(result) == dict.fromkeys(CHAIN, 1)
    assert kernels(result.gm) == 4
