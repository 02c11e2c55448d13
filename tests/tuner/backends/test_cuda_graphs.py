"""GraphedModule: which calls replay which graph, on CPU with a stand-in for the capture; and the
real capture where there is a GPU."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from tuner.backends import registry as backends
from tuner.backends.cuda_graphs import GraphedModule
from tuner.contract.device import Device


class Recorded:
    """What a CUDA graph does, on the CPU: replay recomputes from the static input buffers into
    the output buffers made at capture, and nothing else (the module is not called again with
    the caller's tensors)."""

    def __init__(self, module: nn.Module, static: tuple[Any, ...]) -> None:
        self.module, self.static = module, static
        self.outputs = module(*static)
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        self.outputs.copy_(self.module(*self.static))


def stand_in(module: nn.Module, static: tuple[Any, ...], warmup: int) -> tuple[Recorded, Any]:
    graph = Recorded(module, static)
    return graph, graph.outputs


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return torch.relu(self.fc(x)) * scale


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return Scaled().eval()


def test_a_replay_answers_for_the_callers_inputs_and_hands_out_copies(model: nn.Module) -> None:
    graphed = GraphedModule(model, capture=stand_in)
    with torch.no_grad():
        first_x, second_x = torch.randn(2, 4), torch.randn(2, 4)
        first = graphed(first_x)
        second = graphed(second_x)
        torch.testing.assert_close(first, model(first_x))  # not overwritten by the next call
        torch.testing.assert_close(second, model(second_x))
        second.zero_()
        torch.testing.assert_close(graphed(second_x), model(second_x))
    assert graphed.graph_count == 1


def test_a_graph_captured_in_inference_mode_replays_outside_it(model: nn.Module) -> None:
    """fxtune times under `torch.inference_mode` and profiles outside it; on the H200 the
    profile of a CUDA-graph runner first built while timing failed (bert_mini): its input
    buffers were inference tensors, which may not be written outside inference mode."""
    graphed = GraphedModule(model, capture=stand_in)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    with torch.inference_mode():
        torch.testing.assert_close(graphed(x), model(x))
    with torch.no_grad():
        torch.testing.assert_close(graphed(y), model(y))
    with torch.inference_mode():
        torch.testing.assert_close(graphed(x), model(x))
    assert graphed.graph_count == 1


def test_each_signature_gets_its_own_graph_and_past_the_bound_none(model: nn.Module) -> None:
    graphed = GraphedModule(model, capture=stand_in, max_graphs=3)
    x = torch.randn(2, 4)
    calls = [
        (x,),  # graph 1
        (torch.randn(5, 4),),  # another batch: graph 2
        (x, 2.0),  # another non-tensor argument: graph 3
        (torch.randn(4, 2).t(),),  # (2, 4) with other strides: past the bound, ungraphed
        (torch.randn(2, 4, dtype=torch.float64),),  # another dtype: ungraphed (and an error)
    ]
    with torch.no_grad():
        for args in calls[:4]:
            torch.testing.assert_close(graphed(*args), model(*args))
        with pytest.raises(RuntimeError):  # the module's own error, as without a graph
            graphed(*calls[4])
    assert graphed.graph_count == 3 and graphed.ungraphed_calls == 2


def test_the_cuda_backends_exist_only_on_cuda() -> None:
    assert "cudagraph" not in backends.available_backends(Device.parse("cpu"))
    on_gpu = backends.available_backends(Device.parse("cuda"))
    assert {"cudagraph", "compile-cudagraphs"} <= set(on_gpu)
    assert {"cudagraph", "compile-cudagraphs"} <= set(backends.PEERS)
    assert isinstance(backends.deployed("cudagraph", nn.Identity()), GraphedModule)
    plain = nn.Identity()
    assert backends.deployed("eager", plain) is plain


def test_a_cuda_graph_is_built_in_the_tuner_and_torch_compile_is_probed_first() -> None:
    """Where compiles are isolated (CUDA), torch.compile's candidates are built and run in a
    child first; a CUDA graph compiles nothing, and its child (Python, torch, a CUDA context)
    did not fit in a 15 s budget on the H200, so the small models shipped the original."""
    assert not backends.builds_in_child("cudagraph", probe=True)
    assert backends.builds_in_child("compile", probe=True)
    assert backends.builds_in_child("compile-cudagraphs", probe=True)
    assert not backends.builds_in_child("compile", probe=False)
    assert backends.builds_in_child("inductor", probe=False)


@pytest.mark.cuda
def test_a_real_cuda_graph_replays_the_module() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(8)]).cuda().eval()
    graphed = GraphedModule(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(16, 64, device="cuda")
            torch.testing.assert_close(graphed(x), model(x))
        other = torch.randn(7, 64, device="cuda")
        torch.testing.assert_close(graphed(other), model(other))
    assert graphed.graph_count == 2
