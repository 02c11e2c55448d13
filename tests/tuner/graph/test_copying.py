"""`deep_copy` of an unlifted program module: independent of the original, and no warning
(torch's LeafSpec deprecation, which `copy.deepcopy` of such a module raises)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from tuner.graph.copying import deep_copy


@pytest.fixture(scope="module")
def module() -> torch.nn.Module:
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    return torch.export.export(net.eval(), (torch.randn(3, 4),)).module()


def test_copying_a_program_module_warns_nothing_and_copies_everything(
    module: torch.nn.Module,
) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copied = deep_copy(module)
        again = deep_copy(copied)
    assert [str(w.message) for w in caught] == []
    x = torch.randn(3, 4)
    assert torch.equal(copied(x), module(x)) and torch.equal(again(x), module(x))
    assert copied.graph is not module.graph
    assert copied.graph._codegen is not module.graph._codegen
    assert all(a is not b for a, b in zip(copied.parameters(), module.parameters(), strict=True))
    relu = next(n for n in copied.graph.nodes if n.target == torch.ops.aten.relu.default)
    relu.target = torch.ops.aten.sigmoid.default  # a pass rewriting the copy
    copied.recompile()
    assert not torch.equal(copied(x), module(x))
    assert any(n.target == torch.ops.aten.relu.default for n in module.graph.nodes)


def test_the_warning_it_avoids_is_real_on_this_torch(module: torch.nn.Module) -> None:
    """The control: plain deepcopy warns here; when a torch stops, this test says so."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        copy.deepcopy(module)
    assert any("LeafSpec" in str(w.message) for w in caught)


def test_anything_else_is_a_plain_deep_copy() -> None:
    value = {"a": [torch.ones(2)]}
    copied = deep_copy(value)
    assert copied["a"][0] is not value["a"][0] and torch.equal(copied["a"][0], value["a"][0])
