"""The node profile says where the model's time goes, so the search can start there."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tuner.contract.device import CPU
from tuner.graph.capture import export_module, to_graph_module
from tuner.profiling.node_profile import profile_nodes


class WideThenTiny(nn.Module):
    """One large matmul and one tiny add: nearly all the time is the matmul's."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(512, 2048)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.wide(x), y + 1


@pytest.mark.serial  # a time share: beside three workers the tiny add once measured 35 %
def test_the_profile_finds_the_expensive_node() -> None:
    inputs = (torch.randn(256, 512), torch.randn(4))
    gm = to_graph_module(export_module(WideThenTiny().eval(), inputs))
    profile = profile_nodes(gm, inputs, CPU)
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert set(profile.seconds) == {n.name for n in calls}
    shares = {n.name: profile.share([n.name]) for n in calls}
    assert abs(sum(shares.values()) - 1) < 1e-9
    big = max(shares, key=shares.__getitem__)
    assert "linear" in big or "addmm" in big, shares
    assert shares[big] > 0.8, shares
    assert profile.share(["a node made by a later rewrite"]) is None
