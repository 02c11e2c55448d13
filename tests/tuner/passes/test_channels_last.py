from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

from tests.passes_helpers import assert_equivalent, assert_round_trip, assert_unchanged
from tuner.graph.capture import export_module, to_graph_module
from tuner.passes.apply import count_ops

PASS = ["channels_last"]
NHWC = torch.channels_last


def image(channels: int = 4, size: int = 8):
    return lambda g: (torch.randn(2, channels, size, size, generator=g),)


class Block(nn.Module):
    """A ResNet basic block with its head: in-place relu, `+=` residual, pools, flatten."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(4, 4, 3, padding=1, bias=False)
        self.b1 = nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1)
        self.b2 = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.b1(self.c1(x)))
        out = self.b2(self.c2(out))
        out += x
        out = self.relu(out)
        out = F.adaptive_avg_pool2d(self.pool(out), 1)
        return self.head(out.view(out.shape[0], -1))


def ops_of(module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> int:
    return count_ops(to_graph_module(export_module(module, inputs)))


def format_changes(gm: fx.GraphModule) -> list[torch.memory_format]:
    return [
        n.kwargs["memory_format"]
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target == torch.ops.aten.contiguous.default
    ]


def test_resnet_block_is_one_chain() -> None:
    net = Block().eval()
    before = ops_of(net, image()(torch.Generator()))
    result = assert_equivalent(net, image(), PASS)
    (site,) = result.applied
    assert "2 conv2d, 9 ops" in site.summary
    assert count_ops(result.gm) == before + 2
    assert format_changes(result.gm) == [NHWC, torch.contiguous_format]
    weights = [
        getattr(result.gm, str(n.args[1].target))
        for n in result.gm.graph.nodes
        if n.target == torch.ops.aten.conv2d.default
    ]
    assert len(weights) == 2
    assert all(w.is_contiguous(memory_format=NHWC) and not w.is_contiguous() for w in weights)


def test_chain_outputs_leave_contiguous() -> None:
    class Features(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(4, 6, 3, padding=1)
            self.c2 = nn.Conv2d(6, 6, 3, padding=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            mid = torch.relu(self.c1(x))
            return mid, torch.sigmoid(self.c2(mid))

    net = Features().eval()
    result = assert_equivalent(net, image(), PASS)
    assert len(result.applied) == 1
    outs = result.gm(torch.randn(2, 4, 8, 8))
    assert all(o.is_contiguous() for o in outs)
    assert format_changes(result.gm).count(torch.contiguous_format) == 2


def test_inception_style_cat_joins_branches() -> None:
    class Inception(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv2d(4, 3, 1)
            self.b = nn.Conv2d(4, 5, 3, padding=1)
            self.out = nn.Conv2d(8, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.cat([F.relu6(self.a(x)), F.avg_pool2d(self.b(x), 3, 1, 1)], dim=1)
            return self.out(h).flatten(1)

    result = assert_equivalent(Inception().eval(), image(), PASS)
    (site,) = result.applied
    assert "3 conv2d" in site.summary
    assert format_changes(result.gm) == [NHWC, torch.contiguous_format]


def test_layout_sensitive_op_splits_chains() -> None:
    class Split(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(4, 4, 3, padding=1)
            self.c2 = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.softmax(torch.relu(self.c1(x)), dim=1)
            return self.c2(h)

    result = assert_equivalent(Split().eval(), image(), PASS)
    assert len(result.applied) == 2
    assert len({s.id for s in result.applied}) == 2


def test_training_batch_norm_stays_outside_chains() -> None:
    class TrainBn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(4, 4, 3, padding=1)
            self.bn = nn.BatchNorm2d(4)
            self.c2 = nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c2(self.bn(self.c1(x)))

    result = assert_equivalent(TrainBn().train(), image(), PASS)
    assert [s.summary for s in result.applied] == ["channels_last chain: 1 conv2d, 1 ops"] * 2


# torch.export.save warns that an NHWC tensor does not cover its storage "in order"; it then
# writes the whole storage, which is what loading needs.
@pytest.mark.filterwarnings("ignore:No complete tensor found")
def test_round_trip_keeps_nhwc_weights(tmp_path: Path) -> None:
    net = Block().eval()
    result = assert_equivalent(net, image(), PASS)
    path = tmp_path / "nhwc.pt2"
    assert_round_trip(result, net, image(), path)
    loaded = torch.export.load(path).module()
    nhwc = [b for name, b in loaded.named_buffers() if name.startswith("fxtune_") and b.dim() == 4]
    assert len(nhwc) == 2
    assert all(b.is_contiguous(memory_format=NHWC) for b in nhwc)


def test_no_conv_no_site() -> None:
    net = nn.Sequential(nn.ReLU(), nn.MaxPool2d(2), nn.Hardtanh())
    assert_unchanged(net.eval(), (torch.randn(2, 4, 8, 8),), PASS)


def test_other_convs_untouched() -> None:
    unbatched = nn.Sequential(nn.Conv2d(4, 4, 3), nn.ReLU())
    assert_unchanged(unbatched.eval(), (torch.randn(4, 8, 8),), PASS)
    assert_unchanged(nn.Conv1d(4, 4, 3).eval(), (torch.randn(2, 4, 8),), PASS)


def test_mutated_weight_unchanged() -> None:
    class Mutating(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.randn(4, 4, 3, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(F.conv2d(x, self.w))
            self.w.mul_(0.5)
            return y

    assert_unchanged(Mutating().eval(), (torch.randn(2, 4, 8, 8),), PASS)


@pytest.mark.parametrize("through_view", [False, True])
def test_mutated_chain_input_unchanged(through_view: bool) -> None:
    class Writes(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a = x.flip(3)
            y = self.conv(a)
            (a.view(-1) if through_view else a).mul_(2.0)
            return y, a.sum()

    assert_unchanged(Writes().eval(), (torch.randn(2, 4, 8, 8),), PASS)


def test_conv_output_read_and_written_unchanged() -> None:
    class ReadWrite(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = self.conv(x)
            s = torch.sigmoid(y)
            y.mul_(2.0)
            return s, y.flatten(1)

    assert_unchanged(ReadWrite().eval(), (torch.randn(2, 4, 8, 8),), PASS)


def test_conv_output_written_through_view_unchanged() -> None:
    class ViewWrite(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.conv(x)
            y.view(-1).mul_(2.0)
            return torch.sigmoid(y)

    assert_unchanged(ViewWrite().eval(), (torch.randn(2, 4, 8, 8),), PASS)


class Generated(nn.Module):
    """A conv chain built from op codes; ends in a `view`, which fails on NHWC activations."""

    def __init__(self, codes: list[str], channels: int) -> None:
        super().__init__()
        self.codes = codes
        self.layers = nn.ModuleList()
        c = channels
        for code in codes:
            if code == "conv":
                self.layers.append(nn.Conv2d(c, c + 1, 3, padding=1))
                c += 1
            elif code == "bn":
                bn = nn.BatchNorm2d(c)
                bn.running_mean.normal_()
                self.layers.append(bn)
            elif code == "cat":
                c *= 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = iter(self.layers)
        seen = [x]
        for code in self.codes:
            if code in ("conv", "bn"):
                x = next(layers)(x)
            elif code == "relu":
                x = torch.relu(x)
            elif code == "relu_":
                x = x.relu_()
            elif code == "hardtanh":
                x = F.hardtanh(x)
            elif code == "maxpool":
                x = F.max_pool2d(x, 3, 1, 1)
            elif code == "avgpool":
                x = F.avg_pool2d(x, 3, 1, 1)
            elif code == "add" and len(seen) > 1 and seen[-2].shape == x.shape:
                x = x + seen[-2]
            elif code == "cat":
                x = torch.cat([x, x * 0.5], dim=1)
            seen.append(x)
        return x.view(x.shape[0], -1)


CODES = ["conv", "bn", "relu", "relu_", "hardtanh", "maxpool", "avgpool", "add", "cat"]


@settings(max_examples=10, deadline=None)
@given(
    codes=st.lists(st.sampled_from(CODES), min_size=1, max_size=6),
    channels=st.integers(1, 3),
    size=st.integers(3, 6),
)
def test_property_generated_chains_match(codes: list[str], channels: int, size: int) -> None:
    codes = ["conv", *codes]
    torch.manual_seed(0)
    result = assert_equivalent(Generated(codes, channels).eval(), image(channels, size), PASS)
    # An in-place write to a value read elsewhere may cut the chain, or leave no site at all.
    if "relu_" not in codes:
        assert len(result.applied) == 1
        assert format_changes(result.gm)[0] == NHWC
