"""Rewriting never puts a tensor on the CPU behind the program's back.

A GPU run fails when a pass makes a tensor without the device of those it replaces (issue 11:
`fold_conv_bn` made a bias-free conv's bias with `torch.zeros(n)` on the CPU) or when a program
exported on the CPU is moved with `module.to()`, which leaves devices baked into the graph. On
`meta` the same mistakes show without a GPU: every tensor a pass makes must land on `meta`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import fx, nn

from examples.models import EXAMPLES
from tests.tuner.real_models import bert, image_inputs, resnet
from tuner.graph.capture import example_inputs, export_module, on_device, to_graph_module
from tuner.passes import pass_names
from tuner.passes.apply import apply_steps

META = torch.device("meta")


def off_device(gm: fx.GraphModule) -> list[str]:
    """Every tensor the module holds or a node bakes in that is not on meta, by name."""
    found = [
        f"{k} on {v.device}" for k, v in gm.state_dict(keep_vars=True).items() if v.device != META
    ]
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            value = getattr(gm, str(node.target), None) if "." not in str(node.target) else None
            if isinstance(value, torch.Tensor) and value.device != META:
                found.append(f"attribute {node.target} on {value.device}")
        device = node.kwargs.get("device")
        if device is not None and torch.device(device) != META:
            found.append(f"{node.name} makes a tensor on {device}")
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor) and val.device != META:
            found.append(f"{node.name} computes on {val.device}")
    return found


def rewrite_everything_on_meta(
    module: nn.Module, inputs: tuple[torch.Tensor, ...]
) -> dict[str, int]:
    program = on_device(export_module(module, inputs), "meta")
    gm = to_graph_module(program)
    assert not off_device(gm), "moving the program left tensors behind"
    current = example_inputs(program)
    fired: dict[str, int] = {}
    for name in pass_names():
        step = apply_steps(gm, current, [(name, None)])
        current = step.inputs
        fired[name] = len(step.applied)
        assert not off_device(gm), (name, off_device(gm)[:5])
    assert all(t.device == META for t in current if isinstance(t, torch.Tensor))
    return fired


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_pass_keeps_an_example_on_its_device(name: str) -> None:
    example = EXAMPLES[name]()
    fired = rewrite_everything_on_meta(example.module, example.example_inputs)
    assert sum(fired.values()) > 0, fired


def test_a_bias_free_conv_folds_on_its_own_device() -> None:
    """The case that failed on the H100: conv without bias, then batch norm."""
    conv = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8)).eval()
    fired = rewrite_everything_on_meta(conv, (torch.randn(2, 3, 8, 8),))
    assert fired["fold_conv_bn"] == 1


def test_devices_baked_in_at_export_are_moved() -> None:
    """An op that makes a tensor with `device=cpu` (as attention masks are built) moves too."""

    class Masked(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.arange(x.shape[-1], device=x.device, dtype=x.dtype)

    program = export_module(Masked(), (torch.randn(2, 5),))
    baked = [n for n in program.graph.nodes if n.kwargs.get("device") is not None]
    assert baked and all(torch.device(n.kwargs["device"]).type == "cpu" for n in baked)
    moved = on_device(program, "meta")
    assert not off_device(to_graph_module(moved))


def bert_with_mask() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model, make_inputs = bert("sdpa")
    return model, make_inputs(torch.Generator().manual_seed(0))


def resnet_case() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    model, _ = resnet()
    return model, image_inputs(32)(torch.Generator().manual_seed(0))


@pytest.mark.parametrize("case", [bert_with_mask, resnet_case], ids=["bert", "resnet"])
def test_every_pass_keeps_a_real_model_on_its_device(
    case: Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]],
) -> None:
    model, inputs = case()
    fired = rewrite_everything_on_meta(model, inputs)
    assert sum(fired.values()) > 0, fired
