"""A module replayed from CUDA graphs: one capture per input signature, the module itself otherwise.

On a GPU a recommendation model spends most of its time launching small kernels; a CUDA graph
launches all of them at once (issue 11: 10.4x over eager on the recsys example, where the
passes alone gave 5.2x). The passes and a graph are not rivals: the passes cut the op count,
the graph removes the launch cost of what remains. So "captured in a CUDA graph" is a way of
running any candidate (`tuner.backends.registry`), timed as it will be deployed.

A graph replays fixed kernels on fixed buffers, so `GraphedModule` is careful about what a
replay may answer:
- inputs are copied into the graph's static buffers; a call whose tensors differ in shape,
  dtype, device or strides from every captured signature, or whose other arguments differ,
  gets a graph of its own (captured on first use, up to `max_graphs`), and past that runs the
  module ungraphed: slower, never wrong;
- outputs are cloned out of the graph's buffers, so a caller holding a result does not see it
  overwritten by the next call (torch.compile's "reduce-overhead" hands out the buffers
  themselves and raises when a stale one is read; a clone costs less than a copy's launch);
- it is for inference: capture runs under `torch.no_grad`, so outputs carry no autograd
  history (training configs never choose it: `tuner.tuning.train`).

`capture` is a parameter so the signature handling is testable without a GPU; the real one,
`capture_cuda`, uses the public `torch.cuda.CUDAGraph` API, warming up on a side stream first
as the CUDA graph documentation asks (lazy initialisation must not happen inside a capture).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from tuner.host.torch_compat import pytree

WARMUP_CALLS = 3
MAX_GRAPHS = 8  # each graph holds a private memory pool: a bound on what a deployment keeps


class Replayable(Protocol):
    def replay(self) -> None: ...


# capture(module, static_inputs, warmup_calls) -> (graph, the outputs living in its pool)
Capture = Callable[[nn.Module, tuple[Any, ...], int], tuple[Replayable, Any]]


def capture_cuda(
    module: nn.Module, static_inputs: tuple[Any, ...], warmup_calls: int
) -> tuple[Replayable, Any]:
    """Warm up on a side stream, then capture one call into a `torch.cuda.CUDAGraph`."""
    device = next(t.device for t in static_inputs if isinstance(t, torch.Tensor))
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(warmup_calls):
            module(*static_inputs)
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        outputs = module(*static_inputs)
    return graph, outputs


def _signature(flat: list[Any], spec: Any) -> tuple[Any, ...]:
    """What a replay depends on: each tensor's layout, and every other argument's value."""
    return (
        str(spec),
        *(
            ("tensor", tuple(x.shape), x.stride(), x.dtype, str(x.device))
            if isinstance(x, torch.Tensor)
            else ("value", type(x).__name__, repr(x))
            for x in flat
        ),
    )


@dataclass
class _Captured:
    graph: Replayable
    static_inputs: list[torch.Tensor | Any]
    outputs: Any


class GraphedModule(nn.Module):
    """`module` replayed from CUDA graphs where a call matches a captured signature."""

    def __init__(
        self,
        module: nn.Module,
        *,
        capture: Capture = capture_cuda,
        max_graphs: int = MAX_GRAPHS,
        warmup_calls: int = WARMUP_CALLS,
    ) -> None:
        super().__init__()
        self.module = module
        self._capture = capture
        self.max_graphs = max_graphs
        self.warmup_calls = warmup_calls
        self._graphs: dict[tuple[Any, ...], _Captured] = {}
        self.ungraphed_calls = 0  # calls past max_graphs, run without a graph

    @property
    def graph_count(self) -> int:
        return len(self._graphs)

    def _new(self, args: tuple[Any, ...]) -> _Captured:
        # Buffers that outlive this call are normal tensors even when it runs in inference mode
        # (fxtune times in it, profiles outside it): an inference tensor may not be written
        # outside inference mode, and every replay writes the input buffers.
        with torch.inference_mode(False), torch.no_grad():
            static = pytree.tree_map(
                lambda x: x.clone() if isinstance(x, torch.Tensor) else x, args
            )
            graph, outputs = self._capture(self.module, static, self.warmup_calls)
        return _Captured(graph, pytree.tree_flatten(static)[0], outputs)

    def forward(self, *args: Any) -> Any:
        flat, spec = pytree.tree_flatten(args)
        key = _signature(flat, spec)
        captured = self._graphs.get(key)
        if captured is None:
            if len(self._graphs) >= self.max_graphs:
                self.ungraphed_calls += 1
                return self.module(*args)
            captured = self._graphs[key] = self._new(args)
        for buffer, x in zip(captured.static_inputs, flat, strict=True):
            if isinstance(buffer, torch.Tensor):
                buffer.copy_(x)
        captured.graph.replay()
        return pytree.tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, captured.outputs
        )
