"""Resource bounds of a program, computed from its shapes before anything runs for real.

ATen alone makes bombs without a line of code: `zeros(2**40)`, a chain of 16k x 16k matmuls.
So before a program is tuned (and when it is uploaded) every node's output is sized from fake
tensor propagation (the operators' own shape rules, not the sizes the upload declares), at the
example sizes and at the largest sizes the tuner would measure by default, and every node's cost
is priced by `tuner.loading.op_costs` on `meta` tensors (no data, no compute): torch's FLOP
formulas where it has them, a cost rule for every other op, and a refusal for an op with
neither. A program whose largest intermediate, peak of live tensors or cost per call exceeds the
limits is refused with the node named. Sizes that depend on tensor data (after `nonzero`,
`item`) are taken at the upper bound export recorded for them; none recorded, the program is
refused, since nothing then bounds what it allocates. The bodies of higher-order ops are walked
the same way: `scan` and `map` count their body once per slice, `cond` its dearer branch, and a
`while_loop` (whose trip count is data) is refused.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.contract.errors import ArtifactFormatError, FxtuneError, UnsafeArtifactError
from tuner.graph.capture import example_inputs, to_graph_module
from tuner.graph.shapes import SPEC_KEY, ShapeSpec
from tuner.graph.sizes import default_sizes
from tuner.host import failures
from tuner.loading import op_costs

GiB = 1024**3
# Sustained FLOP/s assumed per device kind when a budget turns into a FLOP limit (costs are in
# FLOP-equivalents: `tuner.loading.op_costs`).
DEVICE_FLOPS = {"cpu": 2e11, "cuda": 5e13, "xla": 5e13}
MIN_CALLS = 20  # a budget must leave room for this many timed calls of the whole model
# Without a budget (an upload, `fxtune sites`): 100 TFLOP a call, about 2 s on an H100 in fp32;
# a 7B-parameter language model over 2k tokens needs 30.
DEFAULT_MAX_FLOPS = 1e14


class ResourceBoundError(UnsafeArtifactError):
    """The program would allocate or compute more than the limits allow."""


@dataclass(frozen=True)
class Bounds:
    max_tensor_bytes: int
    max_live_bytes: int
    max_flops: float

    @classmethod
    def for_host(
        cls, memory_bytes: int, budget_s: float | None = None, device_kind: str = "cpu"
    ) -> Bounds:
        """Limits for a machine with `memory_bytes` (a quarter for one tensor, half for all
        live ones) and, with a budget, the FLOPs that leave time for MIN_CALLS calls."""
        rate = DEVICE_FLOPS.get(device_kind, DEVICE_FLOPS["cpu"])
        flops = DEFAULT_MAX_FLOPS if budget_s is None else budget_s * rate / MIN_CALLS
        return cls(memory_bytes // 4, memory_bytes // 2, flops)


@dataclass(frozen=True)
class Footprint:
    """What one size point of the program needs."""

    sizes: dict[str, int]
    largest_tensor_bytes: int
    largest_node: str
    peak_live_bytes: int
    flops: float


def _evaluate(size: Any, values: Mapping[str, int], node: fx.Node) -> int:
    if isinstance(size, int):
        return size
    expr = size.node.expr if isinstance(size, torch.SymInt) else sympy.sympify(size)
    expr = sympy.sympify(expr).xreplace(
        {s: sympy.Integer(values[s.name]) for s in expr.free_symbols if s.name in values}
    )
    if expr.is_number:
        return int(expr)
    shape_env = size.node.shape_env if isinstance(size, torch.SymInt) else None
    upper = shape_env.bound_sympy(expr).upper if shape_env is not None else sympy.oo
    if not upper.is_finite:
        raise ResourceBoundError(
            f"refused: the size of node {node.name} depends on tensor data with no recorded "
            "upper bound (bound it with torch._check when exporting)"
        )
    return int(upper)


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _shape(t: torch.Tensor, values: Mapping[str, int], node: fx.Node) -> list[int]:
    return [_evaluate(s, values, node) for s in t.shape]


def _nbytes(value: Any, values: Mapping[str, int], node: fx.Node) -> int:
    return sum(math.prod(_shape(t, values, node)) * t.element_size() for t in _tensors(value))


def _aliases_input(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None)


def _on_meta(value: Any, values: Mapping[str, int], node: fx.Node) -> Any:
    if isinstance(value, fx.Node):
        return _on_meta(value.meta.get("val"), values, node)
    if isinstance(value, torch.Tensor):
        return torch.empty(_shape(value, values, node), dtype=value.dtype, device="meta")
    if isinstance(value, torch.SymInt):
        return _evaluate(value, values, node)
    if isinstance(value, torch.device):  # a factory's or `to`'s device: nothing leaves meta
        return torch.device("meta")
    if isinstance(value, list | tuple):
        return type(value)(_on_meta(v, values, node) for v in value)
    return value


# Scalar arithmetic on sizes (`operator.mul`, `math.ceil`, `torch.sym_max`) and `getitem`.
_SCALAR_MODULES = frozenset({"_operator", "operator", "math", "builtins"})


def _scalar(target: Any) -> bool:
    module = getattr(target, "__module__", None)
    name = getattr(target, "__name__", "")
    return module in _SCALAR_MODULES or (module == "torch" and name.startswith(("sym_", "_sym_")))


def _bodies(gm: fx.GraphModule, node: fx.Node) -> list[fx.GraphModule]:
    """The graphs a higher-order op runs (its `get_attr` arguments)."""
    found = []
    for arg in node.args:
        if isinstance(arg, fx.Node) and arg.op == "get_attr":
            body = getattr(gm, str(arg.target), None)
            if isinstance(body, fx.GraphModule):
                found.append(body)
    return found


def _cost(
    gm: fx.GraphModule, node: fx.Node, values: Mapping[str, int], bounds: Bounds
) -> tuple[float, int]:
    """One call of `node`: its cost (`op_costs`) and the peak bytes its bodies hold while it
    runs; UnpricedOpError for anything without a bound."""
    if node.op != "call_function":
        return 0.0, 0
    target = node.target
    hop = op_costs.hop_rule(target)
    if hop is not None:
        hop.check(node.name)
        bodies = [footprint(body, values, bounds) for body in _bodies(gm, node)]
        args = _on_meta(node.args, values, node)
        held = max((b.peak_live_bytes for b in bodies), default=0)
        return hop.cost(node.name, args, [b.flops for b in bodies]), held
    if _scalar(target):
        return 0.0, 0
    if not hasattr(target, "_schema"):
        raise op_costs.UnpricedOpError(
            f"refused: node {node.name} calls {target}, whose cost fxtune cannot bound"
        )
    args = _on_meta(node.args, values, node)
    kwargs = {k: _on_meta(v, values, node) for k, v in node.kwargs.items()}
    out = _on_meta(node.meta.get("val"), values, node)
    try:
        return op_costs.node_cost(node.name, target, args, kwargs, out), 0
    except FxtuneError:
        raise
    except Exception as exc:  # no rule, and no meta kernel to decompose it with
        failures.input_fault(exc, f"pricing node {node.name}")
        raise op_costs.UnpricedOpError(
            f"refused: node {node.name} calls {target}, whose cost fxtune cannot bound: it has "
            f"no cost rule and does not run on meta tensors ({type(exc).__name__})"
        ) from exc


def footprint(gm: fx.GraphModule, values: Mapping[str, int], bounds: Bounds) -> Footprint:
    """Walk the graph once: sizes, the peak of live tensors (freed after their last use), cost;
    refuse at the first node past a limit. Bodies of higher-order ops are walked the same way,
    and what they hold counts on top of the live tensors at their node."""
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    last_use = {n: max((order[u] for u in n.users), default=order[n]) for n in gm.graph.nodes}
    live: dict[fx.Node, int] = {}
    peak = largest = 0
    largest_node = ""
    flops = 0.0
    for node in gm.graph.nodes:
        if node.op == "output":
            break
        value = node.meta.get("val")
        size = 0 if _aliases_input(node) else _nbytes(value, values, node)
        if node.op == "get_attr":
            attr = getattr(gm, str(node.target), None)
            size = attr.numel() * attr.element_size() if isinstance(attr, torch.Tensor) else 0
        if size > bounds.max_tensor_bytes:
            raise ResourceBoundError(
                f"refused: node {node.name} makes a tensor of {size / GiB:.1f} GiB "
                f"(limit {bounds.max_tensor_bytes / GiB:.1f} GiB) at {dict(values) or 'its sizes'}"
            )
        if size > largest:
            largest, largest_node = size, node.name
        live[node] = size
        cost, held = _cost(gm, node, values, bounds)
        peak = max(peak, sum(live.values()) + held)
        if peak > bounds.max_live_bytes:
            raise ResourceBoundError(
                f"refused: at node {node.name} the live tensors need {peak / GiB:.1f} GiB "
                f"(limit {bounds.max_live_bytes / GiB:.1f} GiB)"
            )
        flops += cost
        if flops > bounds.max_flops:
            raise ResourceBoundError(
                f"refused: by node {node.name} one call needs {flops:.3g} FLOPs "
                f"(FLOP-equivalents; limit {bounds.max_flops:.3g} for this budget and device)"
            )
        for done in [n for n in live if _freed(n, last_use, order[node])]:
            del live[done]
    return Footprint(dict(values), largest, largest_node, peak, flops)


def _freed(node: fx.Node, last_use: Mapping[fx.Node, int], now: int) -> bool:
    """A value goes once its last user ran, unless it is a weight or the graph returns it."""
    returned = any(u.op == "output" for u in node.users)
    return last_use[node] <= now and node.op != "get_attr" and not returned


def size_points(
    spec: ShapeSpec | None,
    inputs: tuple[Any, ...],
    sizes: Mapping[str, list[int]] | None = None,
) -> list[dict[str, int]]:
    """The example sizes and the largest the tuner measures (`sizes` given, else its defaults
    from `tuner.graph.sizes`)."""
    if spec is None or not spec.dims:
        return [{}]
    chosen = {**default_sizes(spec, inputs), **(sizes or {})}
    example = {d.symbol: d.example for d in spec.dims}
    large = {d.symbol: max(chosen.get(d.name, [d.example])) for d in spec.dims}
    return [example, large] if large != example else [example]


def check_bounds(
    program: ExportedProgram, bounds: Bounds, sizes: Mapping[str, list[int]] | None = None
) -> list[Footprint]:
    """Refuse a program past `bounds` (ResourceBoundError naming the node); else its needs."""
    gm = to_graph_module(program)
    points = size_points(gm.meta.get(SPEC_KEY), example_inputs(program), sizes)
    return [footprint(gm, values, bounds) for values in points]


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def load_bounded(
    path: Any,
    budget_s: float | None = None,
    device_kind: str = "cpu",
    sizes: Mapping[str, list[int]] | None = None,
) -> ExportedProgram:
    """`load_program`, then `check_bounds` against this machine's memory and the budget:
    what every command that runs an uploaded program loads it with."""
    from tuner.loading.load import load_program

    program = load_program(path)
    bounds = Bounds.for_host(physical_memory_bytes(), budget_s, device_kind)
    try:
        check_bounds(program, bounds, sizes)
    except FxtuneError:
        raise
    except Exception as exc:  # torch refuses the upload's shapes (fxtune's own bug is raised)
        failures.input_fault(exc, "checking the program's resource bounds")
        raise ArtifactFormatError(
            f"the program's shapes do not propagate through its operators "
            f"({type(exc).__name__}: {str(exc)[:300]})"
        ) from exc
    return program
