"""OpenVINO and ONNX Runtime as backends: built in the run's serving child, run as the program.

One artifact per runtime for the module (a dynamic program with nested outputs); the rest are
unit checks. Skipped for a runtime that is not installed (CI's dev install has both).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.export import Dim

from tuner.backends import isolation
from tuner.backends import registry as backends
from tuner.backends.isolation import Children
from tuner.backends.runtime_build import refusal
from tuner.backends.runtime_runner import InputRefused
from tuner.backends.runtimes import installed_version
from tuner.contract.device import CPU
from tuner.contract.errors import CompileCrashed, CompileFailed, CompileOverrun
from tuner.graph.capture import example_inputs, export_module, to_graph_module

RUNTIMES = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(installed_version(name) is None, reason=f"{name} not installed"),
    )
    for name in ("openvino", "onnxruntime")
]


class TwoHeads(nn.Module):
    """A dict of a tensor and a tuple: outputs come back in the program's structure."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> dict[str, Any]:
        h = self.norm(torch.relu(self.fc(x)))
        return {"h": h, "rest": (h.sum(dim=1) + ids.float(), ids * 2)}


def _inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 16), torch.arange(batch, dtype=torch.int64)


@pytest.fixture(scope="module")
def program() -> torch.export.ExportedProgram:
    torch.manual_seed(0)
    batch = Dim("batch", min=2, max=64)
    model = TwoHeads().eval()
    return torch.export.export(model, _inputs(4), dynamic_shapes=({0: batch}, {0: batch}))


@pytest.fixture(scope="module")
def built(
    program: torch.export.ExportedProgram, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, backends.Built]:
    """Each installed runtime's artifact, written by one serving child (as a run does)."""
    gm, inputs = to_graph_module(program), example_inputs(program)
    work = tmp_path_factory.mktemp("runtimes")
    out: dict[str, backends.Built] = {}
    with Children() as children:
        for name in ("openvino", "onnxruntime"):
            if installed_version(name) is not None:
                out[name] = backends.build(name, gm, inputs, work, 120.0, children=children)
    return out


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_the_artifact_answers_as_the_program_at_every_size_in_range(
    runtime: str, program: torch.export.ExportedProgram, built: dict[str, backends.Built]
) -> None:
    b = built[runtime]
    assert b.package is not None and b.package.is_file()
    assert b.compile_s is not None and b.compile_s > 0
    module = program.module()
    for batch in (4, 2, 37, 64):
        inputs = _inputs(batch)
        got, want = b.runner(*inputs), module(*inputs)
        assert set(got) == {"h", "rest"} and isinstance(got["rest"], tuple)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_inputs_the_artifact_was_not_built_for_are_refused(
    runtime: str, built: dict[str, backends.Built]
) -> None:
    """Never a wrong answer: another static size, dtype or count raises before the runtime."""
    run = built[runtime].runner
    x, ids = _inputs(4)
    with pytest.raises(InputRefused, match="shape"):
        run(torch.randn(4, 15), ids)
    with pytest.raises(InputRefused, match=r"float64|int32"):
        run(x.double(), ids)
    with pytest.raises(InputRefused, match="inputs"):
        run(x)


def test_training_steps_and_mutating_programs_are_not_offered() -> None:
    class Counts(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)
            return x * self.calls

    x = torch.randn(2, 3)
    assert "in place" in (refusal(export_module(Counts(), (x,))) or "")
    plain = export_module(nn.Linear(3, 3).eval(), (x,))
    assert refusal(plain) is None
    assert "inference only" in (refusal(plain, train=True) or "")


def test_a_runtime_that_is_not_installed_is_not_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "installed_version", lambda name: None)
    assert backends.available_backends(CPU) == ["eager", "inductor", "compile"]
    monkeypatch.setattr(backends, "installed_version", lambda name: "1.0")
    assert {"openvino", "onnxruntime"} <= set(backends.available_backends(CPU))
    assert {"openvino", "onnxruntime"} <= set(backends.PEERS) & set(backends.CHILD_BUILT)


def test_the_serving_child_survives_a_failed_job_and_not_a_hang_or_a_crash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job that raises is a failed build and the child serves the next; one that hangs is
    stopped at its time; one that kills its process is a crash; each later job gets a child."""
    monkeypatch.setattr(isolation, "CHILD_MODULE", "tests.tuner.backends.misbehaving_served_child")
    with Children() as children:
        with pytest.raises(CompileFailed, match="does not know this operator"):
            children.serve(["raise"], 60, "x", "openvino build")
        _, first = children.serve(["ok"], 60, "x", "openvino build")
        _, again = children.serve(["ok"], 60, "x", "openvino build")
        assert first["pid"] == again["pid"]  # one child, no new Python per build
        with pytest.raises(CompileOverrun):
            children.serve(["hang"], 1.0, "x", "openvino build")
        with pytest.raises(CompileCrashed, match="SIGSEGV"):
            children.serve(["crash"], 60, "the openvino artifact", "openvino build")
