"""Dynamic dimensions: what sizes a program was exported to serve, parsed once from the program.

A program exported with `Dim` carries symbolic sizes (`s77`) in its placeholders' `meta["val"]` and
their ranges in `range_constraints`. Everything fxtune derives from the program must keep serving
exactly that set of inputs: the re-export gets the same `dynamic_shapes`, the fingerprint names
the symbols and ranges (not the example's numbers), and every artifact refuses inputs outside
them. `ShapeSpec` is that one value, built by `shape_spec(program)` and passed down (it rides on
the captured GraphModule as `gm.meta[SPEC_KEY]`, so copies of the module keep it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sympy
import torch
from torch import fx
from torch.export import Dim, ExportedProgram

SPEC_KEY = "fxtune_shape_spec"

# A dimension is either a fixed size or the name of a dynamic dimension.
DimSpec = int | str


@dataclass(frozen=True)
class DynamicDim:
    """One symbolic size: its program symbol, a user-facing name, its range and example value."""

    symbol: str  # as the program names it ("s77"); only meaningful inside that program
    name: str  # "batch", "seq", or "<input>.<dim>" for the first place it appears
    min: int
    max: int | None  # None: unbounded above
    example: int

    def contains(self, size: int) -> bool:
        return size >= self.min and (self.max is None or size <= self.max)

    def describe(self) -> str:
        top = "inf" if self.max is None else str(self.max)
        return f"{self.name} in [{self.min}, {top}]"


class ShapeMismatch(ValueError):
    """Inputs the program was not built for (another static size, or outside a range)."""


@dataclass(frozen=True)
class ShapeSpec:
    """Per positional input: its dims (fixed ints or dynamic-dim names); plus the dynamic dims."""

    inputs: tuple[tuple[DimSpec, ...] | None, ...]  # None for a non-tensor input
    dims: tuple[DynamicDim, ...] = ()
    input_names: tuple[str, ...] = ()  # the placeholders, to find them again after rewrites
    names: dict[str, str] = field(default_factory=dict, compare=False)  # symbol -> name
    # Sizes of inputs a pass built (combine_sparse_inputs' combined index count): exported with
    # their ranges, never checked against a caller's inputs, which keep the original's shapes.
    packed: tuple[DynamicDim, ...] = ()

    @property
    def is_dynamic(self) -> bool:
        return bool(self.dims)

    def dim(self, name: str) -> DynamicDim:
        for d in self.dims:
            if name in (d.name, d.symbol):
                return d
        known = ", ".join(d.name for d in self.dims) or "none"
        raise KeyError(f"no dynamic dimension {name!r} (this program's: {known})")

    def sizes_of(self, inputs: Sequence[Any]) -> dict[str, int]:
        """Each dynamic dim's size in `inputs`; ShapeMismatch for inputs it does not serve."""
        if len(inputs) != len(self.inputs):
            raise ShapeMismatch(f"expected {len(self.inputs)} inputs, got {len(inputs)}")
        seen: dict[str, int] = {}
        for i, (value, dims) in enumerate(zip(inputs, self.inputs, strict=True)):
            if dims is None:
                continue
            if not isinstance(value, torch.Tensor):
                raise ShapeMismatch(f"input {i} must be a tensor, got {type(value).__name__}")
            if value.dim() != len(dims):
                raise ShapeMismatch(
                    f"input {i} has {value.dim()} dims, the program was built for {len(dims)}"
                )
            for d, (size, want) in enumerate(zip(value.shape, dims, strict=True)):
                size = int(size)
                if isinstance(want, int):
                    if size != want:
                        raise ShapeMismatch(
                            f"input {i} has size {size} at dim {d}; the program was built for "
                            f"{want} only" + ("" if self.is_dynamic else " (a static program)")
                        )
                    continue
                if want in seen and seen[want] != size:
                    raise ShapeMismatch(
                        f"input {i} dim {d} is {size} but {want} is {seen[want]} elsewhere"
                    )
                seen[want] = size
        for d in self.dims:
            if d.name in seen and not d.contains(seen[d.name]):
                raise ShapeMismatch(
                    f"{d.name} = {seen[d.name]} is outside the range the program was built for "
                    f"({d.describe()})"
                )
        return seen

    def check(self, inputs: Sequence[Any]) -> None:
        self.sizes_of(inputs)

    def export_dims(self) -> dict[str, Any]:
        """One `torch.export.Dim` per dynamic dim (shared, so equal sizes stay equal)."""
        return {
            d.name: Dim(_identifier(d.name), min=d.min, max=d.max)
            for d in (*self.dims, *self.packed)
        }

    def with_packed(self, dim: DynamicDim) -> ShapeSpec:
        """This spec plus the dynamic size of an input a pass built."""
        return replace(self, packed=(*self.packed, dim), names={**self.names, dim.symbol: dim.name})

    def to_dict(self) -> dict[str, Any]:
        """For configs and reports: names and ranges, never program symbols."""
        return {
            "dims": [{"name": d.name, "min": d.min, "max": d.max} for d in self.dims],
            "inputs": [list(dims) if dims is not None else None for dims in self.inputs],
        }


def _identifier(name: str) -> str:
    """Dim names must be identifiers: "x.0" -> "x_0"."""
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"d_{out}"


def symbol_of(size: Any) -> str | None:
    """The symbol a size is, when it is exactly one free symbol; None for a fixed size.

    Raises ValueError for a size that is an expression of symbols (e.g. `2*s0`): nothing fxtune
    writes can promise to serve such an input exactly, so callers refuse it.
    """
    if isinstance(size, int):
        return None
    if isinstance(size, torch.SymInt):
        expr = size.node.expr
        if isinstance(expr, sympy.Integer):
            return None
        if isinstance(expr, sympy.Symbol):
            return str(expr)
        raise ValueError(f"input size {expr} is an expression of dynamic sizes")
    raise TypeError(f"unexpected size {size!r}")


def linear_in_symbol(size: Any) -> tuple[int, str, int] | None:
    """(a, symbol, b) when `size` is a*symbol + b with a >= 1 (a packed length such as
    `8*s0 + 8`); None for a fixed size or any other expression."""
    if not isinstance(size, torch.SymInt):
        return None
    expr = size.node.expr
    free = list(expr.free_symbols)
    if len(free) != 1:
        return None
    poly = sympy.Poly(expr, free[0])
    if poly.degree() != 1 or not all(c.is_Integer for c in poly.all_coeffs()):
        return None
    a, b = (int(c) for c in poly.all_coeffs())
    return (a, str(free[0]), b) if a >= 1 else None


def _bounds(program: ExportedProgram, symbol: str) -> tuple[int, int | None]:
    for sym, vr in program.range_constraints.items():
        if str(sym) == symbol:
            lower = int(vr.lower)
            upper = vr.upper
            big = not getattr(upper, "is_finite", True) or upper in (sympy.oo, sympy.zoo)
            if not big:
                try:
                    upper_i: int | None = int(upper)
                except (TypeError, OverflowError, AttributeError):  # torch's int_oo: unbounded
                    upper_i = None
            else:
                upper_i = None
            if upper_i is not None and upper_i >= 2**62:
                upper_i = None
            return lower, upper_i
    raise ValueError(f"the program has no range for its dynamic size {symbol}")


def _placeholders(gm: fx.GraphModule) -> list[fx.Node]:
    return list(gm.graph.find_nodes(op="placeholder"))


def spec_from_placeholders(
    program: ExportedProgram, gm: fx.GraphModule, inputs: Sequence[Any]
) -> ShapeSpec:
    """Read the symbolic shapes of the unlifted module's inputs and the program's ranges."""
    names: dict[str, str] = {}
    dims: list[DynamicDim] = []
    per_input: list[tuple[DimSpec, ...] | None] = []
    aliases = {0: "batch", 1: "seq"}
    for node, example in zip(_placeholders(gm), inputs, strict=True):
        v = node.meta.get("val")
        if not isinstance(v, torch.Tensor):
            per_input.append(None)
            continue
        entry: list[DimSpec] = []
        for d, size in enumerate(v.shape):
            sym = symbol_of(size)
            if sym is None:
                entry.append(int(size))
                continue
            if sym not in names:
                alias = aliases.get(d)
                taken = {x.name for x in dims}
                name = alias if alias and alias not in taken else f"{node.target}.{d}"
                low, high = _bounds(program, sym)
                dims.append(DynamicDim(sym, name, low, high, int(example.shape[d])))
                names[sym] = name
            entry.append(names[sym])
        per_input.append(tuple(entry))
    targets = tuple(str(n.target) for n in _placeholders(gm))
    return ShapeSpec(tuple(per_input), tuple(dims), targets, names)


def spec_of(gm: fx.GraphModule) -> ShapeSpec | None:
    """The spec the module was captured with (None for a module fxtune did not capture)."""
    meta = getattr(gm, "meta", None)
    return meta.get(SPEC_KEY) if isinstance(meta, dict) else None


def dynamic_shapes_for(gm: fx.GraphModule) -> tuple[Any, ...] | None:
    """`dynamic_shapes` for re-exporting `gm` so it serves what the original served.

    Read from the module's placeholders (a pass may have added or removed inputs): every size
    that is one of the original's symbols (or of a packed input's, `ShapeSpec.packed`) gets that
    symbol's Dim and range, and a size a*s + b of one of them export's derived Dim `a*dim + b`
    (a packed input's length follows the batch exactly). None when static.
    """
    spec = spec_of(gm)
    if spec is None or not spec.is_dynamic:
        return None
    dims = spec.export_dims()
    out: list[Any] = []
    for node in _placeholders(gm):
        v = node.meta.get("val")
        if not isinstance(v, torch.Tensor):
            out.append(None)
            continue
        entry: dict[int, Any] = {}
        for d, size in enumerate(v.shape):
            if is_static_size(size):
                continue
            linear = linear_in_symbol(size)
            if linear is None or linear[1] not in spec.names:
                raise ValueError(
                    f"input {node.target} dim {d} has a dynamic size ({size}) the original program "
                    "did not have"
                )
            a, sym, b = linear
            root = dims[spec.names[sym]]
            entry[d] = root if (a, b) == (1, 0) else a * root + b
        out.append(entry or None)
    return tuple(out)


def check_still_dynamic(gm: fx.GraphModule) -> None:
    """Raise if a rewrite pinned a dynamic size to its example value.

    `int()` of a SymInt anywhere in a pass specialises the ShapeEnv the metadata lives in; the
    placeholders then read as static and a re-export would quietly serve one size only.
    """
    spec = spec_of(gm)
    if spec is None or not spec.is_dynamic:
        return
    by_name = {str(n.target): n for n in _placeholders(gm)}
    for name, dims in zip(spec.input_names, spec.inputs, strict=True):
        node = by_name.get(name)
        v = node.meta.get("val") if node is not None else None
        if dims is None or not isinstance(v, torch.Tensor):
            continue
        for d, want in enumerate(dims):
            if isinstance(want, str) and symbol_of(v.shape[d]) is None:
                raise ValueError(
                    f"a rewrite fixed the dynamic size {want} of input {name} to {v.shape[d]}"
                )


def is_static_size(size: Any) -> bool:
    return isinstance(size, int) or (
        isinstance(size, torch.SymInt) and isinstance(size.node.expr, sympy.Integer)
    )


def is_static(value: Any) -> bool:
    """Whether a fake tensor's shape is all fixed sizes."""
    return isinstance(value, torch.Tensor) and all(isinstance(s, int) for s in value.shape)
