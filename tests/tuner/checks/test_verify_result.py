"""The service's check of a worker's result, on a program a CUDA worker sent.

The GPU check (H200, torch 2.11) had every result of a CUDA worker refused: the tuned program has
its device baked into ops (`device=cuda:0`) and the service checks on the CPU. Faked here without
a GPU: the device of a CPU export is rewritten to CUDA, as a CUDA export writes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tuner.checks import verify_result
from tuner.checks.verify_result import verify_tuned
from tuner.deploy.replay import replay_steps
from tuner.graph.capture import export_module, save_program


class Masked(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + torch.ones(x.shape[0], 8, device=x.device)


def _as_exported_on_cuda(program: torch.export.ExportedProgram) -> int:
    moved = 0
    for node in program.graph.nodes:
        if isinstance(node.kwargs.get("device"), torch.device):
            node.kwargs = {**node.kwargs, "device": torch.device("cuda", 0)}
            moved += 1
    return moved


def test_a_program_with_cuda_baked_in_is_checked_on_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A config of no passes: its replay packs nothing (the real replay, of zero steps).
    monkeypatch.setattr(verify_result, "apply_config", lambda p, _config: replay_steps(p, []))
    inputs = (torch.randn(4, 8),)
    module = Masked().eval()
    original = save_program(export_module(module, inputs), tmp_path / "original.pt2")
    tuned = export_module(module, inputs)
    assert _as_exported_on_cuda(tuned) >= 1
    save_program(tuned, tmp_path / "tuned.pt2")
    assert verify_tuned(original, tmp_path / "tuned.pt2", {"mode": "infer"}) is None

    with torch.no_grad():
        module.linear.bias += 1.0  # other weights, the same graph: still refused
    save_program(export_module(module, inputs), tmp_path / "forged.pt2")
    assert verify_tuned(original, tmp_path / "forged.pt2", {"mode": "infer"})
