"""Sites: the subgraphs a pass can rewrite, and their stable structural ids.

A site id hashes what the subgraph computes (ops, constant arguments, shapes, dtypes, and how its
nodes feed each other), never node names or weight values. Two identical towers in one model, or
the same block in two models, get the same id, so a measurement made for one serves the other.
Nor the device: of an op with several results only those the graph reads are described, because
the others' shapes are the kernel's business (embedding_bag's `offset2bag` is empty on the CPU and
one per index on CUDA), and a config tuned on a GPU must replay on the CPU program a deployment
or the service's result check loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch import fx

from tuner.contract.op_strings import canonical_argument
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
    # The id this site had before ids left unread results out (configs stored then still replay);
    # None where it is the same.
    legacy_id: str | None = field(default=None, compare=False, hash=False)

    def matching(self, wanted: Collection[str]) -> Site | None:
        """This site if a config asks for it, under the id the config knows it by; else None."""
        if self.id in wanted:
            return self
        if self.legacy_id is not None and self.legacy_id in wanted:
            return dataclasses.replace(self, id=self.legacy_id, legacy_id=None)
        return None

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


def _read_results(n: fx.Node) -> set[int] | None:
    """The indices of `n`'s results that the graph uses (export keeps a `getitem` of every
    result, used or not); None where a user takes them all."""
    read: set[int] = set()
    for user in n.users:
        if user.target is not operator.getitem or not isinstance(user.args[1], int):
            return None
        if user.users:
            read.add(user.args[1])
    return read


def _leaves_results_unread(nodes: Sequence[fx.Node]) -> bool:
    """Whether a site's nodes or their inputs include an op with a result the graph does not
    read: only then does its id differ from the one it had before (`Site.legacy_id`)."""
    seen = {*nodes, *(a for n in nodes for a in n.all_input_nodes)}
    for n in seen:
        v = val(n)
        if isinstance(v, (list, tuple)):
            read = _read_results(n)
            if read is not None and len(read) < len(v):
                return True
    return False


def _describe_node(n: fx.Node, rename: Rename, read_only: bool) -> Any:
    v = val(n)
    read = _read_results(n) if read_only and isinstance(v, (list, tuple)) else None
    if read is None:
        return _describe_value(v, rename)
    return tuple(_describe_value(x, rename) if i in read else "unread" for i, x in enumerate(v))


def _describe_arg(
    a: Any,
    index: dict[fx.Node, int],
    externals: dict[fx.Node, int],
    rename: Rename = None,
    read_only: bool = False,
) -> Any:
    if isinstance(a, fx.Node):
        if a in index:
            return ("n", index[a])
        if a not in externals:
            externals[a] = len(externals)
        kind = "w" if a.op == "get_attr" else "x"
        return (kind, externals[a], _describe_node(a, rename, read_only))
    if isinstance(a, (list, tuple)):
        return tuple(_describe_arg(x, index, externals, rename, read_only) for x in a)
    if isinstance(a, dict):
        return tuple(
            sorted((k, _describe_arg(v, index, externals, rename, read_only)) for k, v in a.items())
        )
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


def _loaded_arguments(n: fx.Node) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """`n`'s arguments as fxtune's loader keeps them (free-text messages replaced:
    `tuner.contract.op_strings`), so a program in memory and the same program saved and loaded
    get one fingerprint."""
    schema = getattr(n.target, "_schema", None)
    if schema is None or not any(isinstance(a, str) for a in (*n.args, *n.kwargs.values())):
        return n.args, dict(n.kwargs)
    names = [a.name for a in schema.arguments]
    args = tuple(
        canonical_argument(n.target, names[i], a) if i < len(names) else a
        for i, a in enumerate(n.args)
    )
    return args, {k: canonical_argument(n.target, k, v) for k, v in n.kwargs.items()}


def structural_id(
    pass_name: str, nodes: Sequence[fx.Node], rename: Rename = None, *, read_only: bool = False
) -> str:
    """A short hash of the subgraph formed by `nodes` (taken in graph order).

    Dynamic sizes enter as their symbols; `rename` maps them to names that do not depend on how
    a torch version numbers its symbols (the fingerprint's), site ids keep them as they are,
    except data-dependent ones (`_data_sizes`). `read_only` (site ids) describes only the results
    of a multi-result op that the graph reads; the model fingerprint, computed on the program as
    exported, describes them all, as it always has.
    """
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    ordered = sorted(nodes, key=order.__getitem__)
    rename = {**_data_sizes(ordered), **_packed_sizes(ordered), **(rename or {})} or None
    index = {n: i for i, n in enumerate(ordered)}
    externals: dict[fx.Node, int] = {}
    parts: list[Any] = [pass_name]
    for n in ordered:
        args, kwargs = _loaded_arguments(n)
        parts.append(
            (
                n.op,
                str(n.target),
                _describe_arg(args, index, externals, rename, read_only),
                _describe_arg(kwargs, index, externals, rename, read_only),
                _describe_node(n, rename, read_only),
            )
        )
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def make_site(pass_name: str, nodes: Sequence[fx.Node], summary: str, **extra: Any) -> Site:
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    names = tuple(n.name for n in sorted(nodes, key=order.__getitem__))
    site_id = structural_id(pass_name, nodes, read_only=True)
    legacy_id = structural_id(pass_name, nodes) if _leaves_results_unread(nodes) else None
    return Site(pass_name, site_id, names, summary, dict(extra), legacy_id=legacy_id)
