"""Small FX helpers shared by the passes: matching ops, reading shapes, adding weights."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from tuner.host.torch_compat import torch_ops

aten = torch.ops.aten


def is_call(node: Any, *targets: Any) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def val(node: fx.Node) -> Any:
    """The fake value recorded by capture (a FakeTensor, a tuple of them, or a Python value)."""
    return node.meta.get("val")


def tensor_val(node: Any) -> torch.Tensor | None:
    if not isinstance(node, fx.Node):
        return None
    v = val(node)
    return v if isinstance(v, torch.Tensor) else None


class SymbolicSize(ValueError):
    """A pass needed a fixed size where the program has a dynamic one; the site is refused."""


def sizes(node: fx.Node) -> tuple[int | torch.SymInt, ...]:
    """The node's sizes: ints where fixed, SymInts where the program is dynamic."""
    v = tensor_val(node)
    if v is None:
        raise ValueError(f"node {node.name} has no tensor metadata")
    return tuple(s if isinstance(s, torch.SymInt) else int(s) for s in v.shape)


def is_symbolic(size: Any) -> bool:
    """A dynamic size. (`int()` of one would silently give the example's value.)"""
    return isinstance(size, torch.SymInt) and not size.node.is_constant()


def shape(node: fx.Node) -> tuple[int, ...]:
    """The node's sizes, all fixed; SymbolicSize when one is dynamic (never the example's)."""
    out = sizes(node)
    dynamic = [i for i, s in enumerate(out) if is_symbolic(s)]
    if dynamic:
        raise SymbolicSize(f"node {node.name} has dynamic sizes at dims {dynamic}")
    return tuple(int(s) for s in out)


def size_args(graph: fx.Graph, node: fx.Node) -> list[int | fx.Node]:
    """Sizes to pass to view/reshape that stay right at every size the program serves.

    Fixed dims are ints; each dynamic dim is read at run time (`aten.sym_size.int`), which
    export turns back into the program's symbol. Call it where nodes may be inserted.
    """
    return [
        graph.call_function(aten.sym_size.int, (node, d)) if is_symbolic(s) else int(s)
        for d, s in enumerate(sizes(node))
    ]


def arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    """A call's argument whether it was passed by position or keyword."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def getitem_users(node: fx.Node) -> dict[int, fx.Node] | None:
    """For a multi-output node: index -> its getitem user, or None if used any other way."""
    out: dict[int, fx.Node] = {}
    for user in node.users:
        if not is_call(user, operator.getitem) or user.args[1] in out:
            return None
        out[user.args[1]] = user
    return out


def only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def attr_tensor(gm: fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The real tensor behind a `get_attr` node (a weight), else None."""
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    obj: Any = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, torch.Tensor) else None


def add_weight(
    gm: fx.GraphModule, stem: str, tensor: torch.Tensor, *, persistent: bool = True
) -> str:
    """Register a new constant tensor on the module under a fresh name; returns the name.

    `persistent=False` keeps it out of the state_dict: a training graph's constants (index
    shifts) must not add keys, so the tuned module's state_dict still loads into the original.
    """
    base = "fxtune_" + stem.replace(".", "_")
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    gm.register_buffer(name, tensor.detach().clone().contiguous(), persistent=persistent)
    return name


# gm.meta key marking a graph captured for training (`tuner.graph.capture.to_graph_module`).
TRAIN_KEY = "fxtune_train"


def is_training(gm: fx.GraphModule) -> bool:
    """Whether `gm` is tuned as a training step: its parameters must stay the trainable leaves.

    Passes that would derive new weights from parameters (stacked, concatenated, re-laid-out)
    then compute them inside the graph on every step instead of storing a constant, so the
    gradient reaches the original parameters and an optimizer over them still trains the module.
    """
    return bool(gm.meta.get(TRAIN_KEY, False))


def derived_weight(
    gm: fx.GraphModule,
    sources: Sequence[fx.Node],
    stem: str,
    value: Callable[[], torch.Tensor],
    build: Callable[[fx.Graph, list[fx.Node]], fx.Node],
) -> fx.Node:
    """A weight computed from `sources` (get_attr nodes): at inference a constant registered
    under `stem` (`value()` computes it once), in training `build(graph, sources)` nodes that
    compute it per step (insert where the sources are visible)."""
    if is_training(gm):
        return build(gm.graph, list(sources))
    return gm.graph.get_attr(add_weight(gm, stem, value()))


def mutated_nodes(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes written in place directly; `mutated_aliases` adds every view sharing their storage."""
    mutated: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch_ops.OpOverload):
            continue
        schema = node.target._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                target = arg(node, i, a.name)
                if isinstance(target, fx.Node):
                    mutated.add(target)
    return mutated


def ancestors(node: fx.Node, stop: Iterable[fx.Node] = ()) -> set[fx.Node]:
    """Every node that `node` depends on (transitively)."""
    seen: set[fx.Node] = set(stop)
    stack = list(node.all_input_nodes)
    out: set[fx.Node] = set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        out.add(n)
        stack.extend(n.all_input_nodes)
    return out


def independent_groups(nodes: Sequence[fx.Node], min_size: int = 2) -> list[list[fx.Node]]:
    """Split candidate nodes into sets with no data dependency inside a set (seed 002's BFS step).

    Nodes are visited in graph order; each joins the first set none of whose members it depends
    on. Fusing a set horizontally is then always legal.
    """
    groups: list[list[fx.Node]] = []
    deps: dict[fx.Node, set[fx.Node]] = {n: ancestors(n) for n in nodes}
    for node in nodes:
        for group in groups:
            if not any(member in deps[node] for member in group):
                group.append(node)
                break
        else:
            groups.append([node])
    return [g for g in groups if len(g) >= min_size]


def topo_first(nodes: Iterable[fx.Node]) -> fx.Node:
    """The earliest node in graph order."""
    nodes = list(nodes)
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    return min(nodes, key=order.__getitem__)


def topo_last(nodes: Iterable[fx.Node]) -> fx.Node:
    nodes = list(nodes)
    order = {n: i for i, n in enumerate(nodes[0].graph.nodes)}
    return max(nodes, key=order.__getitem__)


def _alias_sources(node: fx.Node) -> list[fx.Node]:
    """The inputs whose storage `node`'s output may share (views, in-place results, pieces)."""
    if is_call(node, operator.getitem):
        return [node.args[0]] if isinstance(node.args[0], fx.Node) else []
    if node.op != "call_function" or not isinstance(node.target, torch_ops.OpOverload):
        return []
    schema = node.target._schema
    # Lists of views (split's `Tensor(a)[]`) keep their alias set on the element type, which
    # Python cannot read: any aliasing return counts as aliasing every annotated argument.
    if not any(r.alias_info for r in schema.returns):
        return []
    return [
        value
        for i, a in enumerate(schema.arguments)
        if a.alias_info
        for value in [arg(node, i, a.name)]
        if isinstance(value, fx.Node)
    ]


def mutated_aliases(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes that share storage with a tensor written in place (through any chain of views).

    `mutated_nodes` gives only the direct target: `x.view(-1).mul_(2)` marks the view, not `x`.
    Rewrites that re-read or alias a tensor must refuse every node of such an alias class,
    since re-sorting the graph may move their reads across the write.
    """
    parent: dict[fx.Node, fx.Node] = {}

    def find(n: fx.Node) -> fx.Node:
        while parent.get(n, n) is not n:
            n = parent[n]
        return n

    for node in gm.graph.nodes:
        for src in _alias_sources(node):
            parent[find(node)] = find(src)
    roots = {find(n) for n in mutated_nodes(gm)}
    return {n for n in gm.graph.nodes if find(n) in roots}


SPLIT_OPS = (aten.split.Tensor, aten.split_with_sizes.default)


@dataclass(frozen=True)
class SplitPieces:
    """A split whose every piece is read through exactly one getitem."""

    split: fx.Node
    source: fx.Node
    dim: int
    sizes: tuple[int, ...]
    items: tuple[fx.Node, ...]


def split_pieces(node: Any) -> SplitPieces | None:
    """Describe an aten split (dim normalised, sizes from metadata); None when a piece is unread."""
    if not is_call(node, *SPLIT_OPS) or not isinstance(node.args[0], fx.Node):
        return None
    pieces = val(node)
    source = tensor_val(node.args[0])
    users = getitem_users(node)
    if source is None or not isinstance(pieces, (list, tuple)) or users is None:
        return None
    if sorted(users) != list(range(len(pieces))):
        return None
    dim = int(arg(node, 2, "dim", 0)) % source.dim()
    if any(is_symbolic(p.shape[dim]) for p in pieces):
        return None  # pieces of dynamic size: see split_refusal
    widths = tuple(int(p.shape[dim]) for p in pieces)
    return SplitPieces(node, node.args[0], dim, widths, tuple(users[i] for i in range(len(pieces))))


def split_refusal(node: Any) -> str | None:
    """Why a split's pieces cannot be fused: they have a dynamic size (None otherwise)."""
    if not is_call(node, *SPLIT_OPS):
        return None
    pieces = val(node)
    if isinstance(pieces, (list, tuple)) and any(
        isinstance(p, torch.Tensor) and any(is_symbolic(s) for s in p.shape) for p in pieces
    ):
        source = tensor_val(node.args[0]) if isinstance(node.args[0], fx.Node) else None
        if source is not None:
            dim = int(arg(node, 2, "dim", 0)) % source.dim()
            if any(is_symbolic(p.shape[dim]) for p in pieces):
                return f"{node.name} splits a dynamic dimension (piece sizes vary with the input)"
    return None
