from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

from tests.passes_helpers import assert_equivalent, assert_round_trip, assert_unchanged
from tuner.graph.capture import export_module, to_graph_module
from tuner.passes import get_pass
from tuner.passes.apply import count_ops

PASS = ["fuse_horizontal_linear"]
aten = torch.ops.aten
GEMMS = (aten.linear.default, aten.bmm.default, aten.baddbmm.default)


def gemms(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.target in GEMMS)


def ops_of(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    return count_ops(to_graph_module(export_module(module, inputs)))


class Attention(nn.Module):
    """Q/K/V projections of one input, then heads split with `view` (a strided-slice hazard)."""

    def __init__(self, dim: int = 8, heads: int = 2, bias: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, dim, bias=bias)
        self.k = nn.Linear(dim, dim, bias=bias)
        self.v = nn.Linear(dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.q(x).view(b, s, self.heads, d // self.heads).transpose(1, 2)
        k = self.k(x).view(b, s, self.heads, d // self.heads).transpose(1, 2)
        v = self.v(x).view(b, s * d).view(b, s, self.heads, -1).transpose(1, 2)
        att = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
        return (att @ v).sum(1)


class Towers(nn.Module):
    """Same-shaped linears on different inputs (recommendation-model towers)."""

    def __init__(self, n: int = 3, fin: int = 6, fout: int = 5, bias: bool = True) -> None:
        super().__init__()
        self.towers = nn.ModuleList(nn.Linear(fin, fout, bias=bias) for _ in range(n))

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(t(x)) for t, x in zip(self.towers, xs, strict=True)], -1)


def seq_input(batch: int = 2, seq: int = 3, dim: int = 8):
    return lambda g: (torch.randn(batch, seq, dim, generator=g),)


def tower_inputs(n: int = 3, shape: tuple[int, ...] = (4, 6)):
    return lambda g: tuple(torch.randn(*shape, generator=g) for _ in range(n))


def test_shared_input_becomes_one_linear() -> None:
    net = Attention().eval()
    before = ops_of(net, seq_input()(torch.Generator()))
    result = assert_equivalent(net, seq_input(), PASS)
    (site,) = result.applied
    assert site.summary == "3 linears -> one linear on the shared input"
    assert [n.target for n in result.gm.graph.nodes if n.target in GEMMS] == [aten.linear.default]
    # three linears become one linear and one split, plus a copy for v.view(b, s * d) only
    assert count_ops(result.gm) == before - 3 + 2 + 1
    assert sum(1 for n in result.gm.graph.nodes if n.target == aten.contiguous.default) == 1


def test_shared_input_without_bias_and_uneven_widths() -> None:
    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(8, 3, bias=False)
            self.b = nn.Linear(8, 5, bias=False)
            self.c = nn.Linear(8, 1, bias=False)
            self.d = nn.Linear(8, 2, bias=False)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self.a(x), self.b(x).sigmoid(), self.c(x), self.d(x)

    net = Heads().eval()
    before = ops_of(net, seq_input()(torch.Generator()))
    result = assert_equivalent(net, seq_input(), PASS)
    assert len(result.applied) == 1
    assert gemms(result.gm) == 1
    assert count_ops(result.gm) == before - 2


def test_towers_become_one_baddbmm() -> None:
    net = Towers(n=4).eval()
    before = ops_of(net, tower_inputs(4)(torch.Generator()))
    result = assert_equivalent(net, tower_inputs(4), PASS)
    (site,) = result.applied
    assert site.summary == "4 linears -> one bmm"
    assert [n.target for n in result.gm.graph.nodes if n.target in GEMMS] == [aten.baddbmm.default]
    assert count_ops(result.gm) == before - 4 + 3


def test_towers_on_3d_inputs_without_bias() -> None:
    net = Towers(n=2, bias=False).eval()
    result = assert_equivalent(net, tower_inputs(2, (2, 3, 6)), PASS)
    assert len(result.applied) == 1
    assert [n.target for n in result.gm.graph.nodes if n.target in GEMMS] == [aten.bmm.default]


def test_heads_of_one_output_become_one_batched_dot_product(tmp_path: Path) -> None:
    net = Towers(n=4, fin=16, fout=1).eval()
    inputs = tower_inputs(4, (32, 16))
    result = assert_equivalent(net, inputs, PASS)
    (site,) = result.applied
    assert site.summary == "4 linears -> one batched dot product"
    assert gemms(result.gm) == 0
    targets = [n.target for n in result.gm.graph.nodes]
    assert aten.mul.Tensor in targets and aten.sum.dim_IntList in targets
    assert_round_trip(result, net, inputs, tmp_path / "dot.pt2")


def test_heads_of_one_output_without_bias_on_3d_inputs() -> None:
    result = assert_equivalent(
        Towers(n=2, fout=1, bias=False).eval(), tower_inputs(2, (2, 3, 6)), PASS
    )
    assert len(result.applied) == 1 and gemms(result.gm) == 0


def test_shared_input_preferred_over_bmm() -> None:
    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.p = nn.Linear(6, 6)
            self.q = nn.Linear(6, 6)
            self.r = nn.Linear(6, 6)

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.p(x) + self.q(x) + self.r(y)

    result = assert_equivalent(Both().eval(), tower_inputs(2, (4, 6)), PASS)
    (site,) = result.applied
    assert site.extra["kind"] == "concat"
    assert len(site.nodes) == 2
    assert gemms(result.gm) == 2


def test_dependent_linears_never_grouped() -> None:
    mlp = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6))
    assert_unchanged(mlp.eval(), (torch.randn(4, 6),), PASS)


def test_independent_layers_of_two_stacks_are_grouped() -> None:
    class TwoStacks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6))
            self.b = nn.Sequential(nn.Linear(6, 6), nn.ReLU(), nn.Linear(6, 6))

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.a(x) * self.b(y)

    gm = to_graph_module(export_module(TwoStacks().eval(), tower_inputs(2)(torch.Generator())))
    sites = get_pass("fuse_horizontal_linear").find_sites(gm)
    assert len(sites) == 2
    assert all(len(s.nodes) == 2 for s in sites)
    result = assert_equivalent(TwoStacks().eval(), tower_inputs(2, (4, 6)), PASS)
    assert gemms(result.gm) == 2


def test_min_group_size_option() -> None:
    gm = to_graph_module(export_module(Towers(n=3).eval(), tower_inputs(3)(torch.Generator())))
    assert len(get_pass("fuse_horizontal_linear", min_group_size=4).find_sites(gm)) == 0
    assert len(get_pass("fuse_horizontal_linear", batched=False).find_sites(gm)) == 0
    assert len(get_pass("fuse_horizontal_linear", min_group_size=3).find_sites(gm)) == 1


def test_training_graph_fuses() -> None:
    result = assert_equivalent(Attention().train(), seq_input(), PASS)
    assert len(result.applied) == 1


def test_round_trip(tmp_path: Path) -> None:
    attention = Attention().eval()
    result = assert_equivalent(attention, seq_input(), PASS)
    assert_round_trip(result, attention, seq_input(), tmp_path / "concat.pt2")
    towers = Towers().eval()
    result = assert_equivalent(towers, tower_inputs(), PASS)
    assert_round_trip(result, towers, tower_inputs(), tmp_path / "bmm.pt2")


def test_mixed_dtypes_unchanged() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 5)
            self.b = nn.Linear(6, 5).double()

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x), self.b(x.double())

    assert_unchanged(Mixed().eval(), (torch.randn(4, 6),), PASS)


def test_mixed_bias_unchanged() -> None:
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 5)
            self.b = nn.Linear(6, 5, bias=False)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x), self.b(x)

    assert_unchanged(Mixed().eval(), (torch.randn(4, 6),), PASS)


def test_mutated_weight_unchanged() -> None:
    class Mutating(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 5, bias=False)
            self.register_buffer("w", torch.randn(5, 6))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = F.linear(x, self.w)
            self.w.mul_(0.5)
            return self.a(x), y

    assert_unchanged(Mutating().eval(), (torch.randn(4, 6),), PASS)


@pytest.mark.parametrize("through_view", [False, True])
def test_mutated_input_unchanged(through_view: bool) -> None:
    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(6, 5)
            self.b = nn.Linear(6, 5)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = x * 2.0
            y = self.a(h)
            (h.view(-1) if through_view else h).add_(1.0)
            return y, self.b(h)

    assert_unchanged(Writes().eval(), (torch.randn(4, 6),), PASS)


@settings(max_examples=10, deadline=None)
@given(
    widths=st.lists(st.integers(1, 6), min_size=2, max_size=4),
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    fin=st.integers(1, 6),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_shared_input(
    widths: list[int], lead: list[int], fin: int, bias: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    heads = nn.ModuleList(nn.Linear(fin, w, bias=bias) for w in widths)

    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = heads

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(torch.tanh(h(x)) for h in self.heads)

    result = assert_equivalent(Heads().eval(), tower_inputs(1, (*lead, fin)), PASS)
    assert len(result.applied) == 1
    assert gemms(result.gm) == 1


@settings(max_examples=10, deadline=None)
@given(
    n=st.integers(2, 4),
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=2),
    fin=st.integers(1, 6),
    fout=st.integers(1, 6),
    bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_towers(
    n: int, lead: list[int], fin: int, fout: int, bias: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    net = Towers(n, fin, fout, bias).eval()
    result = assert_equivalent(net, tower_inputs(n, (*lead, fin)), PASS)
    assert len(result.applied) == 1
    assert gemms(result.gm) == (0 if fout == 1 else 1)
