"""Running a bucketed config: the right bucket's module per call, in Python or in one program.

`tuner.search.buckets` decides the buckets; here they run. `SizeDispatch` is what `load_tuned`
returns for a config with buckets; `dispatching_program` is the one exported program (a
`torch.cond` per bucket edge) that `tuned.pt2` holds, which loads with plain torch.
"""

from __future__ import annotations

import inspect
import keyword
import types
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

from tuner.contract.config import Bucket
from tuner.graph.shapes import ShapeMismatch, ShapeSpec, dynamic_shapes_for, spec_of


def _where(spec: ShapeSpec, dim: str) -> tuple[int, int]:
    """(input index, axis) of the first place the bucket dimension appears in the inputs."""
    for i, dims in enumerate(spec.inputs):
        if dims is not None and dim in dims:
            return i, list(dims).index(dim)
    raise ValueError(f"no input has the dynamic dimension {dim}")


class SizeDispatch(nn.Module):
    """Runs, per call, the module of the bucket the input's size falls in (each built once).

    Inputs outside every bucket raise ShapeMismatch; the buckets cover the program's range, so
    with `tuner.deploy.client.CheckedInputs` in front (which falls back to the untuned module
    outside that range) this is never reached by a caller's inputs.
    """

    def __init__(self, spec: ShapeSpec, buckets: Sequence[Bucket], modules: Sequence[nn.Module]):
        super().__init__()
        if not buckets or len(buckets) != len(modules):
            raise ValueError("one module per bucket, and at least one bucket")
        self.buckets = list(buckets)
        self.branches = nn.ModuleList(modules)
        self.where = _where(spec, buckets[0].dim)

    def bucket_index(self, args: Sequence[Any]) -> int:
        i, axis = self.where
        size = int(args[i].shape[axis])
        for k, b in enumerate(self.buckets):
            if b.contains(size):
                return k
        raise ShapeMismatch(f"{self.buckets[0].dim} = {size} is in no size bucket")

    def forward(self, *args: Any) -> Any:
        return self.branches[self.bucket_index(args)](*args)


class _CondDispatch(nn.Module):
    """The same dispatch written with `torch.cond` on the symbolic size, so that it exports:
    the shipped `.pt2` holds every bucket's graph and picks one per call, in the program."""

    def __init__(
        self, where: tuple[int, int], uppers: Sequence[int], branches: Sequence[nn.Module]
    ):
        super().__init__()
        self.where = where
        self.uppers = list(uppers)  # every bucket's maximum but the last's
        self.branches = nn.ModuleList(branches)

    def _pick(self, k: int, args: tuple[Any, ...]) -> Any:
        if k == len(self.branches) - 1:
            return self.branches[k](*args)
        i, axis = self.where
        return torch.cond(
            args[i].shape[axis] <= self.uppers[k],
            lambda *a: self.branches[k](*a),
            lambda *a: self._pick(k + 1, a),
            args,
        )

    def forward(self, *args: Any) -> Any:
        return self._pick(0, args)


def _named_like(module: _CondDispatch, names: Sequence[str]) -> None:
    """Give the dispatch the original's input names, which export reads from the signature:
    the program's placeholders and its guard messages ("x.size()[0] <= 4096") then read as the
    original's do, and callers may pass inputs by name as before."""
    if not names or not all(n.isidentifier() and not keyword.iskeyword(n) for n in names):
        return
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(n, kind) for n in ("self", *names)]

    def forward(self: _CondDispatch, *args: Any) -> Any:
        return self._pick(0, args)

    forward.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    module.forward = types.MethodType(forward, module)  # type: ignore[method-assign]


def _described(shapes: tuple[Any, ...] | None) -> str:
    """dynamic_shapes as comparable text (a `Dim` compares by identity, not by name and range)."""
    if shapes is None:
        return "static"
    return repr([None if s is None else sorted((k, repr(v)) for k, v in s.items()) for s in shapes])


def dispatching_program(
    buckets: Sequence[Bucket], branches: Sequence[nn.Module], inputs: tuple[Any, ...]
) -> ExportedProgram:
    """One exported program that serves the original's whole range and runs, per call, the
    bucket's graph (`torch.cond` on the size). Raises when a branch cannot be exported so, or
    when the branches take different inputs (a pass that repacks inputs)."""
    spec = spec_of(branches[0])  # type: ignore[arg-type]
    if spec is None:
        raise ValueError("a bucket's module lost the program's input shapes")
    shapes = [dynamic_shapes_for(b) for b in branches]  # type: ignore[arg-type]
    if len({_described(s) for s in shapes}) > 1:
        raise ValueError("the buckets' modules take different inputs")
    uppers = [b.max for b in buckets[:-1]]
    if any(u is None for u in uppers):
        raise ValueError("only the last bucket may be unbounded above")
    module = _CondDispatch(_where(spec, buckets[0].dim), uppers, branches)  # type: ignore[arg-type]
    _named_like(module, spec.input_names)
    dynamic: Any = shapes[0]
    if dynamic is not None and inspect.signature(module.forward).parameters.get("args"):
        dynamic = (dynamic,)  # still forward(*args): the inputs are one tuple
    return torch.export.export(module, inputs, dynamic_shapes=dynamic, strict=False)
