"""The sizes a dynamic program is tuned at: chosen by the user (`--sizes batch=1,32,512`) or
picked from each dynamic dimension's range, and inputs made at each of them.

A rewrite that wins at the example's batch of 32 can lose at 4096; so every decision is measured
at each size point, and inputs for a point are made from the example's (same dtypes, fixed dims
kept, dynamic dims resized, values drawn like the example's) and checked by running the original
program on them: a point whose inputs the original cannot run is skipped with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tuner.contract.errors import InputError
from tuner.graph.shapes import ShapeSpec
from tuner.host import failures

Sizes = dict[str, list[int]]

# The large default size is bounded so that one set of inputs stays below this many bytes.
LARGE_INPUT_BYTES = 64 * 2**20
LARGE_FACTOR = 16  # ... and, for a dim without a maximum, this many times the example


@dataclass(frozen=True)
class SizePoint:
    """One combination of dynamic sizes, with inputs made at it."""

    label: str  # "batch=32" ("batch=8,seq=128" for several dims)
    sizes: dict[str, int]
    inputs: tuple[Any, ...]


def parse_sizes(text: str | Sequence[str] | None) -> Sizes:
    """`"batch=1,32,512"` (several dims: separate with ';' or pass a list) -> {"batch": [...]}."""
    if not text:
        return {}
    parts = [text] if isinstance(text, str) else list(text)
    out: Sizes = {}
    for part in (p.strip() for chunk in parts for p in chunk.split(";")):
        if not part:
            continue
        name, eq, values = part.partition("=")
        if not eq or not name.strip():
            raise InputError(f"sizes must look like name=1,32,512, not {part!r}")
        try:
            sizes = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise InputError(f"sizes for {name.strip()} must be integers: {values!r}") from None
        if not sizes or any(s < 0 for s in sizes):
            raise InputError(f"sizes for {name.strip()} must be non-negative integers")
        out[name.strip()] = sorted(set(sizes))
    return out


def _bytes_per_unit(spec: ShapeSpec, inputs: Sequence[Any], name: str) -> float:
    """Input bytes per unit of one dynamic dim, the others at their example values."""
    total = 0.0
    for value, dims in zip(inputs, spec.inputs, strict=True):
        if dims is None or not isinstance(value, torch.Tensor) or name not in dims:
            continue
        total += value.numel() * value.element_size() / max(spec.dim(name).example, 1)
    return total


def default_sizes(spec: ShapeSpec, inputs: Sequence[Any]) -> Sizes:
    """Per dynamic dim: its minimum, the example, and a large value bounded by memory: the
    top of the dim's range when one set of inputs there fits in LARGE_INPUT_BYTES (a decision
    measured only up to 16x the example was shipped up to the top, and there the passes can
    lose: the dynamic recsys's at batch 4096 ran 0.78x), else LARGE_FACTOR times the example."""
    out: Sizes = {}
    for d in spec.dims:
        per_unit = max(_bytes_per_unit(spec, inputs, d.name), 1.0)
        large = d.max if d.max is not None else d.example * LARGE_FACTOR
        large = min(large, int(LARGE_INPUT_BYTES / per_unit))
        out[d.name] = sorted({d.min, d.example, max(large, d.example)})
    return out


def _values_like(example: torch.Tensor, shape: list[int], gen: torch.Generator) -> torch.Tensor:
    """New values of `shape` drawn like the example's: floats around its mean and spread,
    integers among its values (so indices stay valid), non-decreasing vectors (offsets) sorted."""
    if example.is_floating_point():
        mean = float(example.double().mean()) if example.numel() else 0.0
        std = float(example.double().std()) if example.numel() > 1 else 1.0
        noise = torch.randn(shape, generator=gen, dtype=torch.float64)
        return (noise * std + mean).to(example.dtype).to(example.device)
    flat = example.reshape(-1)
    if flat.numel() == 0:
        return torch.zeros(shape, dtype=example.dtype, device=example.device)
    picks = torch.randint(0, flat.numel(), (max(1, int(torch.Size(shape).numel())),), generator=gen)
    values = flat.cpu()[picks][: int(torch.Size(shape).numel())].reshape(shape)
    if example.dim() == 1 and example.numel() > 1 and bool((flat[1:] >= flat[:-1]).all()):
        values = values.sort().values
        if values.numel() and int(flat[0]) == 0:
            values[0] = 0
    return values.to(example.device)


def resized_inputs(
    spec: ShapeSpec, inputs: Sequence[Any], sizes: Mapping[str, int], seed: int = 0
) -> tuple[Any, ...]:
    """The example inputs with each dynamic dim at `sizes` (others at their example values)."""
    gen = torch.Generator().manual_seed(seed)
    examples = {d.name: d.example for d in spec.dims}
    out: list[Any] = []
    for value, dims in zip(inputs, spec.inputs, strict=True):
        if dims is None or all(isinstance(d, int) for d in dims):
            out.append(value)
            continue
        shape = [d if isinstance(d, int) else int(sizes.get(d, examples[d])) for d in dims]
        out.append(_values_like(value, shape, gen))
    return tuple(out)


def _label(sizes: Mapping[str, int]) -> str:
    return ",".join(f"{k}={v}" for k, v in sizes.items())


def size_points(
    spec: ShapeSpec,
    inputs: Sequence[Any],
    wanted: Sizes | None,
    runs: Callable[[tuple[Any, ...]], Any],
) -> tuple[list[SizePoint], list[str]]:
    """The example point first, then one point per position in the size lists (dims zipped:
    the i-th size of each dim together, a shorter list repeating its last), and the reasons
    for sizes that were skipped. `runs` is the original program: a point it fails on is skipped.
    """
    example = {d.name: d.example for d in spec.dims}
    points = [SizePoint(_label(example) or "example", example, tuple(inputs))]
    if not spec.is_dynamic:
        return points, []
    skipped: list[str] = []
    chosen: Sizes = {}
    for name, values in (wanted or default_sizes(spec, inputs)).items():
        try:
            dim = spec.dim(name)
        except KeyError as exc:
            raise InputError(str(exc.args[0])) from None
        for v in values:
            if not dim.contains(v):
                skipped.append(f"{dim.name}={v}: outside the program's range ({dim.describe()})")
        chosen[dim.name] = [v for v in values if dim.contains(v)]
    chosen = {k: v for k, v in chosen.items() if v}
    count = max((len(v) for v in chosen.values()), default=0)
    seen = {points[0].label}
    for i in range(count):
        sizes = dict(example)
        for name, values in chosen.items():
            sizes[name] = values[min(i, len(values) - 1)]
        label = _label(sizes)
        if label in seen:
            continue
        seen.add(label)
        made = resized_inputs(spec, inputs, sizes, seed=i + 1)
        try:
            with torch.no_grad():
                runs(made)
        except Exception as exc:
            failures.fallback(exc, f"running the original program at {label}")
            skipped.append(
                f"{label}: the original program fails on inputs made at this size "
                f"({type(exc).__name__}: {str(exc)[:200]})"
            )
            continue
        points.append(SizePoint(label, sizes, made))
    return points, skipped
