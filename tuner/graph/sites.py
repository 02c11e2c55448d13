"""Sites: the subgraphs a pass can rewrite, and their stable structural ids.

A site id hashes what the subgraph computes (ops, constant arguments, shapes, dtypes, and how its
nodes feed each other), never node names or weight values. Two identical towers in one model, or
the same block in two models, get the same id, so a measurement made for one serves the other.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch import fx

from tuner.graph.nodes import val
from tuner.graph.shapes import spec_of


@dataclass(frozen=True)
class Site:
    """One place where a pass applies. `nodes` are names in the graph the site was found in."""

    pass_name: str
    id: str
    nodes: tuple[str, ...]
    summary: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pass": self.pass_name,
            "id": self.id,
            "nodes": list(self.nodes),
            "summary": self.summary,
        }


_UNBACKED = re.compile(r"u\d+")

# symbol name -> the name to hash it under (the fingerprint's canonical names); None: as is
Rename = dict[str, str] | None


def _describe_size(s: Any, rename: Rename = None) -> Any:
    """A fixed size as its int; a dynamic one as its expression (`s0`), never its example value
    (`int()` of a SymInt would also pin the program's ShapeEnv to that value)."""
    if isinstance(s, torch.SymInt):
        expr = s.node.expr
        if expr.is_number:
            return int(expr)
        if rename:
            expr = expr.xreplace(
                {
                    sym: sympy.Symbol(rename[str(sym)])
                    for sym in expr.free_symbols
                    if str(sym) in rename
                }
            )
        return str(expr)
    return int(s)


def _describe_value(v: Any, rename: Rename = None) -> Any:
    if isinstance(v, torch.Tensor):
        return ("T", tuple(_describe_size(s, rename) for s in v.shape), str(v.dtype))
    if isinstance(v, torch.SymInt):
        return ("S", _describe_size(v, rename))
    if isinstance(v, (list, tuple)):
        return tuple(_describe_value(x, rename) for x in v)
    if isinstance(v, (int, float, bool, str, type(None))):
        return v
    return type(v).__name__


def _describe_arg(
    a: Any, index: dict[fx.Node, int], externals: dict[fx.Node, int], rename: Rename = None
) -> Any:
    if isinstance(a, fx.Node):
        if a in index:
            return ("n", index[a])
        if a not in externals:
            externals[a] = len(externals)
        kind = "w" if a.op == "get_attr" else "x"
        return (kind, externals[a], _describe_value(val(a), rename))
    if isinstance(a, (list, tuple)):
        return tuple(_describe_arg(x, index, externals, rename) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _describe_arg(v, index, externals, rename)) for k, v in a.items()))
    if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(a)
    return a


def _data_sizes(nodes: Sequence[fx.Node]) -> dict[str, str]:
    """Data-dependent sizes (torch's unbacked `u7`, e.g. a split at counts read from an input)
    named by first appearance: their numbers count every propagation in the ShapeEnv, so the same
    graph captured twice would otherwise hash differently and a config could not be replayed."""
    out: dict[str, str] = {}
    values: list[Any] = []
    for n in nodes:
        values += [val(n), *(val(a) for a in n.all_input_nodes)]
    for v in values:
        sizes = v.shape if isinstance(v, torch.Tensor) else [v]
        for size in sizes:
            if isinstance(size, torch.SymInt):
                for sym in sorted(size.node.expr.free_symbols, key=str):
                    if _UNBACKED.fullmatch(str(sym)) and str(sym) not in out:
                        out[str(sym)] = f"data{len(out)}"
    return out


def _packed_sizes(nodes: Sequence[fx.Node]) -> dict[str, str]:
    """Sizes of inputs a pass made (`ShapeSpec.packed`) by their names: their symbols are new in
    each capture, like data-dependent ones."""
    spec = spec_of(nodes[0].graph.owning_module) if nodes else None
    return {d.symbol: d.name for d in spec.packed} if spec is not None else {}


def structural_id(pass_name: str, nodes: Sequence[fx.Node], rename: Rename = None) -> str:
    """A short hash of the subgraph formed by `nodes` (taken in graph order).

    Dynamic sizes enter as their symbols; `rename` maps them to names that do not depend on how
    a torch version numbers its symbols (the fingerprint's), site ids keep them as they are,
    except data-dependent ones (`_data_sizes`).
    """
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    ordered = sorted(nodes, key=order.__getitem__)
    rename = {**_data_sizes(ordered), **_packed_sizes(ordered), **(rename or {})} or None
    index = {n: i for i, n in enumerate(ordered)}
    externals: dict[fx.Node, int] = {}
    parts: list[Any] = [pass_name]
    for n in ordered:
        parts.append(
            (
                n.op,
                str(n.target),
                _describe_arg(n.args, index, externals, rename),
                _describe_arg(n.kwargs, index, externals, rename),
                _describe_value(val(n), rename),
            )
        )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def make_site(pass_name: str, nodes: Sequence[fx.Node], summary: str, **extra: Any) -> Site:
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    names = tuple(n.name for n in sorted(nodes, key=order.__getitem__))
    return Site(pass_name, structural_id(pass_name, nodes), names, summary, dict(extra))
