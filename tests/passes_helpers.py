"""Checks every pass test uses: equal outputs where a pass fires, no change where it must not."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from tuner.apply import Transformed, apply_steps
from tuner.capture import export_module, to_graph_module

InputMaker = Callable[[torch.Generator], tuple[Any, ...]]


def transform(module: nn.Module, inputs: tuple[Any, ...], passes: Sequence[str]) -> Transformed:
    gm = to_graph_module(export_module(module, inputs))
    return apply_steps(gm, inputs, [(p, None) for p in passes])


def outputs_of(out: Any) -> list[torch.Tensor]:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def assert_equivalent(
    module: nn.Module,
    make_inputs: InputMaker,
    passes: Sequence[str],
    trials: int = 3,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> Transformed:
    """Transform with the first inputs; compare on `trials` fresh random inputs of that shape."""
    gen = torch.Generator().manual_seed(0)
    result = transform(module, make_inputs(gen), passes)
    with torch.no_grad():
        for _ in range(trials):
            inputs = make_inputs(gen)
            expected = outputs_of(module(*inputs))
            got = outputs_of(result.gm(*result.pack(inputs)))
            assert len(expected) == len(got)
            for e, g in zip(expected, got, strict=True):
                torch.testing.assert_close(g, e, rtol=rtol, atol=atol)
    return result


def graph_text(module: nn.Module, inputs: tuple[Any, ...]) -> str:
    return str(to_graph_module(export_module(module, inputs)).graph)


def assert_unchanged(module: nn.Module, inputs: tuple[Any, ...], passes: Sequence[str]) -> None:
    """The pass finds no site and the graph stays exactly as exported."""
    before = graph_text(module, inputs)
    result = transform(module, inputs, passes)
    assert result.applied == []
    assert str(result.gm.graph) == before
