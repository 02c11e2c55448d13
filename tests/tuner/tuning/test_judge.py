"""Judging at further sizes: a size whose calls are slow gets the time its rounds need.

distilbert_dyn beside two busy processes: every candidate was timed at the example, but at
batch 64 (about a second a call) the whole-model budget fitted no round, so none counted as
measured and the original shipped, 0.90x of AOTInductor.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tuner.tuning.tuner import TuneOptions, tune_program


class TwoTowers(nn.Module):
    """Two linears on one input (a fuse_horizontal_linear site): a candidate to judge."""

    def __init__(self, width: int = 768) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.left(x)) + torch.relu(self.right(x))


def _tuned(tmp_path: Path, budget_s: float) -> dict[str, dict[str, object]]:
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=2, max=8192)
    program = torch.export.export(
        TwoTowers().eval(),
        (torch.randn(8, 768),),
        dynamic_shapes={"x": {0: batch}},
        strict=False,
    )
    options = TuneOptions(
        budget_s=budget_s,
        backends=["eager"],
        threads=1,
        sizes={"batch": [8, 2048]},
        whole_model_budget_s=0.12,  # one call at batch 2048 takes about that on one thread
        cache_path=tmp_path / "cache.json",
        workdir=tmp_path,
    )
    outcome = tune_program(program, options)
    judged = [f for f in outcome.config.candidates if f.per_size]
    assert judged, [f.name for f in outcome.config.candidates]
    return {f.name: {p.label: p for p in f.per_size} for f in judged}


@pytest.mark.serial
def test_a_slow_size_gets_the_time_its_rounds_need(tmp_path: Path) -> None:
    for name, sizes in _tuned(tmp_path, budget_s=30).items():
        big = sizes["batch=2048"]
        assert big.rounds >= 6, (name, big)  # an interval, not "no timed round fitted"
        assert big.verdict != "not measured", (name, big)
