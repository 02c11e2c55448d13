"""Capture: the editable graph the tuner measures carries no per-call cost a deployment lacks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.export import Dim

from tuner.graph.capture import to_graph_module


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_the_captured_graph_does_not_check_symbolic_sizes_on_every_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The original is the baseline every candidate is timed against: export's sympy check of
    each dynamic size (milliseconds a call) would make every rewrite look faster than it is."""
    import torch.export._unlift as unlift

    program = torch.export.export(
        Mlp().eval(), (torch.randn(32, 16),), dynamic_shapes=({0: Dim("batch", min=2)},)
    )
    gm = to_graph_module(program)

    def checked(*_: Any) -> None:
        raise AssertionError("the symbolic input check ran")

    monkeypatch.setattr(unlift, "_check_input_constraints_for_graph", checked)
    x = torch.randn(5, 16)
    torch.testing.assert_close(gm(x), program.module()(x))
    gm.validate_inputs = True  # the control: the check is there to be skipped
    with pytest.raises(AssertionError, match="symbolic input check"):
        gm(x)
