"""Sites: the subgraphs a pass can rewrite, and their stable structural ids.

A site id hashes what the subgraph computes (ops, constant arguments, shapes, dtypes, and how its
nodes feed each other), never node names or weight values. Two identical towers in one model, or
the same block in two models, get the same id, so a measurement made for one serves the other.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from tuner.graph import val


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


def _describe_value(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("T", tuple(int(s) for s in v.shape), str(v.dtype))
    if isinstance(v, (list, tuple)):
        return tuple(_describe_value(x) for x in v)
    if isinstance(v, (int, float, bool, str, type(None))):
        return v
    return type(v).__name__


def _describe_arg(a: Any, index: dict[fx.Node, int], externals: dict[fx.Node, int]) -> Any:
    if isinstance(a, fx.Node):
        if a in index:
            return ("n", index[a])
        if a not in externals:
            externals[a] = len(externals)
        kind = "w" if a.op == "get_attr" else "x"
        return (kind, externals[a], _describe_value(val(a)))
    if isinstance(a, (list, tuple)):
        return tuple(_describe_arg(x, index, externals) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _describe_arg(v, index, externals)) for k, v in a.items()))
    if isinstance(a, (torch.dtype, torch.device, torch.memory_format, torch.layout)):
        return str(a)
    return a


def structural_id(pass_name: str, nodes: Sequence[fx.Node]) -> str:
    """A short hash of the subgraph formed by `nodes` (taken in graph order)."""
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    ordered = sorted(nodes, key=order.__getitem__)
    index = {n: i for i, n in enumerate(ordered)}
    externals: dict[fx.Node, int] = {}
    parts: list[Any] = [pass_name]
    for n in ordered:
        parts.append(
            (
                n.op,
                str(n.target),
                _describe_arg(n.args, index, externals),
                _describe_arg(n.kwargs, index, externals),
                _describe_value(val(n)),
            )
        )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def make_site(pass_name: str, nodes: Sequence[fx.Node], summary: str, **extra: Any) -> Site:
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    names = tuple(n.name for n in sorted(nodes, key=order.__getitem__))
    return Site(pass_name, structural_id(pass_name, nodes), names, summary, dict(extra))
