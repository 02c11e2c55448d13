"""Checks every pass test uses: equal outputs where a pass fires, no change where it must not."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tuner.graph.capture import export_module, to_graph_module
from tuner.passes.apply import Transformed, apply_steps

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


def assert_round_trip(
    result: Transformed,
    module: nn.Module,
    make_inputs: InputMaker,
    path: Path,
    trials: int = 2,
    rtol: float = 1e-5,
    atol: float = 1e-5,
) -> None:
    """The rewritten module re-exports, saves, loads with plain torch and still matches `module`."""
    torch.export.save(result.to_program(), path)
    loaded = torch.export.load(path).module()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(trials):
            inputs = make_inputs(gen)
            expected = outputs_of(module(*inputs))
            got = outputs_of(loaded(*result.pack(inputs)))
            assert len(expected) == len(got)
            for e, g in zip(expected, got, strict=True):
                torch.testing.assert_close(g, e, rtol=rtol, atol=atol)


def apply_every_pass(
    module: nn.Module,
    make_inputs: InputMaker,
    trials: int = 2,
    rtol: float = 1e-4,
    atol: float = 1e-4,
) -> Transformed:
    """Every registered pass in chaining order, checked after each so a failure names its pass."""
    from tuner.passes import pass_names

    gen = torch.Generator().manual_seed(0)
    samples = [make_inputs(gen) for _ in range(trials + 1)]
    with torch.no_grad():
        expected = [outputs_of(module(*x)) for x in samples]
    gm = to_graph_module(export_module(module, samples[0]))
    total = Transformed(gm, samples[0])
    for name in pass_names():
        try:
            step = apply_steps(gm, total.inputs, [(name, None)])
        except Exception as exc:
            raise AssertionError(f"pass {name} failed to apply: {exc!r:.800}") from exc
        total.inputs = step.inputs
        total.applied += step.applied
        total.packers += step.packers
        if not step.applied:
            continue
        with torch.no_grad():
            for x, want in zip(samples, expected, strict=True):
                got = outputs_of(gm(*total.pack(x)))
                assert len(got) == len(want), f"pass {name} changed the number of outputs"
                for w, g in zip(want, got, strict=True):
                    torch.testing.assert_close(
                        g, w, rtol=rtol, atol=atol, msg=lambda m, n=name: f"after {n}: {m}"
                    )
    return total


def fired(result: Transformed) -> dict[str, int]:
    """How many sites each pass rewrote."""
    counts: dict[str, int] = {}
    for site in result.applied:
        counts[site.pass_name] = counts.get(site.pass_name, 0) + 1
    return counts


def sparse_feature(
    gen: torch.Generator,
    rows: int,
    count: int,
    bags: int,
    include_last_offset: bool = False,
    dtype: torch.dtype = torch.int64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Valid embedding-bag inputs: `count` indices below `rows` cut into `bags` bags (some may be
    empty) by sorted offsets that start at 0 (and end at `count` with `include_last_offset`)."""
    indices = torch.randint(0, rows, (count,), generator=gen, dtype=dtype)
    cuts = torch.randint(0, count + 1, (bags - 1,), generator=gen, dtype=dtype).sort().values
    ends = [torch.tensor([count], dtype=dtype)] if include_last_offset else []
    return indices, torch.cat([torch.zeros(1, dtype=dtype), cuts, *ends])


class Ranker(nn.Module):
    """A dense input between the sparse features, one embedding bag per feature."""

    def __init__(self, rows: Sequence[int], width: int = 4, mode: str = "sum") -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(r, width, mode=mode) for r in rows)
        self.dense = nn.Linear(3, width)

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        i0, o0, dense, *rest = xs
        pooled = [self.bags[0](i0, o0)]
        pooled += [
            bag(i, o) for bag, i, o in zip(self.bags[1:], rest[::2], rest[1::2], strict=True)
        ]
        return self.dense(dense) + torch.stack(pooled).sum(0)


def ranker_inputs(rows: Sequence[int], counts: Sequence[int], bags: int) -> InputMaker:
    def make(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        sparse = [sparse_feature(gen, r, c, bags) for r, c in zip(rows, counts, strict=True)]
        dense = torch.randn(bags, 3, generator=gen)
        return (*sparse[0], dense, *(t for pair in sparse[1:] for t in pair))

    return make
