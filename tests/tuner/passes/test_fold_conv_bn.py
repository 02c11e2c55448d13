from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from tests.passes_helpers import assert_equivalent, assert_round_trip, assert_unchanged
from tuner.graph.capture import export_module, to_graph_module
from tuner.passes.apply import count_ops

PASS = ["fold_conv_bn"]
CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}


def randomize_stats(module: nn.Module, seed: int = 0) -> nn.Module:
    """Fresh batch norms are the identity; give them statistics worth folding."""
    gen = torch.Generator().manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=gen))
            m.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
            if m.affine:
                with torch.no_grad():
                    m.weight.copy_(torch.randn(n, generator=gen))
                    m.bias.copy_(torch.randn(n, generator=gen))
    return module


class ConvBn(nn.Module):
    def __init__(
        self,
        dim: int = 2,
        cin: int = 3,
        cout: int = 4,
        kernel: int = 3,
        stride: int = 1,
        groups: int = 1,
        bias: bool = True,
        affine: bool = True,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.conv = CONV[dim](cin, cout, kernel, stride=stride, groups=groups, bias=bias)
        self.bn = BN[dim](cout, affine=affine, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def image(dim: int, channels: int = 3, size: int = 8):
    return lambda g: (torch.randn(2, channels, *([size] * dim), generator=g),)


def ops_before(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    return count_ops(to_graph_module(export_module(module, inputs)))


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("bias", [True, False])
def test_folds_eval_batch_norm(dim: int, bias: bool) -> None:
    net = randomize_stats(ConvBn(dim=dim, bias=bias)).eval()
    make = image(dim, size=6)
    before = ops_before(net, make(torch.Generator()))
    result = assert_equivalent(net, make, PASS)
    assert len(result.applied) == 1
    assert "batch_norm" not in str(result.gm.graph)
    assert count_ops(result.gm) == before - 1
    (conv,) = [n for n in result.gm.graph.nodes if n.op == "call_function" and "conv" in n.name]
    assert conv.args[2] is not None


def test_folds_without_affine_and_with_string_padding() -> None:
    class Same(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding="same", bias=False)
            self.bn = nn.BatchNorm2d(4, affine=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x))

    result = assert_equivalent(randomize_stats(Same()).eval(), image(2), PASS)
    assert len(result.applied) == 1


def test_folds_every_block_of_a_stack() -> None:
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, groups=2),
        nn.BatchNorm2d(4),
    )  # fmt: skip
    result = assert_equivalent(randomize_stats(net).eval(), image(2), PASS)
    assert len(result.applied) == 2
    assert len({s.id for s in result.applied}) == 2


def test_round_trip(tmp_path: Path) -> None:
    net = randomize_stats(ConvBn()).eval()
    result = assert_equivalent(net, image(2), PASS)
    assert_round_trip(result, net, image(2), tmp_path / "folded.pt2")


def test_training_batch_norm_unchanged() -> None:
    assert_unchanged(ConvBn().train(), (torch.randn(2, 3, 8, 8),), PASS)


def test_conv_output_used_twice_unchanged() -> None:
    class Twice(ConvBn):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.conv(x)
            return self.bn(y), y

    assert_unchanged(randomize_stats(Twice()).eval(), (torch.randn(2, 3, 8, 8),), PASS)


def test_batch_norm_not_right_after_conv_unchanged() -> None:
    class Gap(ConvBn):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(torch.relu(self.conv(x)))

    assert_unchanged(randomize_stats(Gap()).eval(), (torch.randn(2, 3, 8, 8),), PASS)


@pytest.mark.parametrize("through_view", [False, True])
def test_mutated_conv_weight_unchanged(through_view: bool) -> None:
    class Mutating(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.randn(4, 3, 3, 3))
            self.bn = nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn(F.conv2d(x, self.w))
            (self.w.view(-1) if through_view else self.w).mul_(0.5)
            return y

    assert_unchanged(Mutating().eval(), (torch.randn(2, 3, 8, 8),), PASS)


def test_mutated_running_stats_unchanged() -> None:
    class Drifting(ConvBn):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn(self.conv(x))
            self.bn.running_mean.add_(1.0)
            return y

    assert_unchanged(Drifting().eval(), (torch.randn(2, 3, 8, 8),), PASS)


@settings(max_examples=10, deadline=None)
@given(
    dim=st.sampled_from([1, 2, 3]),
    groups=st.sampled_from([1, 2]),
    cin_per_group=st.integers(1, 3),
    cout_per_group=st.integers(1, 3),
    kernel=st.integers(1, 3),
    stride=st.integers(1, 2),
    bias=st.booleans(),
    affine=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-3]),
    seed=st.integers(0, 2**16),
)
def test_property_folded_conv_matches(
    dim: int,
    groups: int,
    cin_per_group: int,
    cout_per_group: int,
    kernel: int,
    stride: int,
    bias: bool,
    affine: bool,
    eps: float,
    seed: int,
) -> None:
    torch.manual_seed(seed)
    cin = groups * cin_per_group
    net = ConvBn(dim, cin, groups * cout_per_group, kernel, stride, groups, bias, affine, eps)
    result = assert_equivalent(randomize_stats(net, seed).eval(), image(dim, cin, 5), PASS)
    assert len(result.applied) == 1
    assert "batch_norm" not in str(result.gm.graph)
