import torch
from torch import nn

from tests.passes_helpers import assert_equivalent, assert_unchanged


class DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(torch.relu(x)))


def test_removes_dropout_in_eval() -> None:
    net = DropNet().eval()
    result = assert_equivalent(net, lambda g: (torch.randn(4, 8, generator=g),), ["remove_dropout"])
    assert len(result.applied) == 1
    assert "dropout" not in str(result.gm.graph)


def test_keeps_dropout_in_training() -> None:
    assert_unchanged(DropNet().train(), (torch.randn(4, 8),), ["remove_dropout"])
