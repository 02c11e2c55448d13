"""Fuse parallel linears into one GEMM (Inductor's group/batch fusion, seed 002).

Several small GEMMs leave a CPU or GPU underused and pay launch and dispatch costs each time.
Linears that read the same input (attention Q/K/V, MLP heads) become one linear with the weights
concatenated, whose output is split back; linears on different inputs of one shape (towers)
become one batched matmul on the stacked inputs. Only linears independent of each other can be
fused, which `independent_groups` (the BFS step) guarantees.

Towers of one output each (a multi-task model's heads) become a batched dot product instead, a
multiply and a sum, because a bmm with one output column is a slow GEMM: on 2 CPU cores, four
[256, 64] x [64, 1] heads took 41 us as one baddbmm and 17 us as multiply-sum in eager, and
inductor fuses the multiply-sum into the kernel that produced its input.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from collections.abc import Callable, Hashable

import torch
from torch import fx

from tuner.graph.nodes import (
    arg,
    aten,
    attr_tensor,
    derived_weight,
    independent_groups,
    is_call,
    is_symbolic,
    mutated_aliases,
    shape,
    size_args,
    sizes,
    tensor_val,
    topo_first,
    topo_last,
)
from tuner.graph.sites import Site, make_site
from tuner.passes import register
from tuner.passes.base import GraphPass

GraphBuild = Callable[[fx.Graph, list[fx.Node]], fx.Node]


def _weights(gm: fx.GraphModule, linear: fx.Node) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = attr_tensor(gm, arg(linear, 1, "weight"))
    assert weight is not None
    bias_node = arg(linear, 2, "bias")
    return weight, attr_tensor(gm, bias_node) if bias_node is not None else None


def _candidate(
    gm: fx.GraphModule, node: fx.Node, mutated: set[fx.Node], mutated_attrs: set[str]
) -> bool:
    """A linear with constant weights; neither they nor its input (or a view of it) is written."""
    if not is_call(node, aten.linear.default) or node.args[0] in mutated:
        return False
    x, weight, bias = node.args[0], arg(node, 1, "weight"), arg(node, 2, "bias")
    params = [p for p in (weight, bias) if p is not None]
    if not all(isinstance(p, fx.Node) and p.op == "get_attr" for p in params):
        return False
    tensors = [attr_tensor(gm, p) for p in params]
    x_val, w_val = tensor_val(x), tensors[0]
    return (
        x_val is not None
        and w_val is not None
        and x_val.dim() >= 1
        and w_val.dim() == 2
        and all(t is not None and t.dtype == x_val.dtype for t in tensors)
        and not any(str(p.target) in mutated_attrs for p in params)
    )


def _key(gm: fx.GraphModule, linear: fx.Node) -> tuple[Hashable, ...]:
    weight, bias = _weights(gm, linear)
    return (weight.dtype, bias is not None)


def _in_order(groups: dict[Hashable, list[fx.Node]], min_size: int) -> list[list[fx.Node]]:
    out = []
    for members in groups.values():
        out.extend(independent_groups(members, min_size))
    return out


@register
class FuseHorizontalLinear(GraphPass):
    name = "fuse_horizontal_linear"
    train_safe = True  # concatenates/stacks the weights inside the graph in training
    description = "Fuse independent linears: shared input -> one concatenated linear, else bmm."
    default_options = {"min_group_size": 2, "batched": True, "dot": True}

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        mutated = mutated_aliases(gm)
        attrs = {str(n.target) for n in mutated if n.op == "get_attr"}
        linears = [n for n in gm.graph.nodes if _candidate(gm, n, mutated, attrs)]
        min_size = self.options["min_group_size"]
        shared: dict[Hashable, list[fx.Node]] = defaultdict(list)
        for n in linears:
            shared[(n.args[0], *_key(gm, n))].append(n)
        groups = [("concat", g) for g in _in_order(shared, min_size)]
        if self.options["batched"]:
            taken = {n for _, g in groups for n in g}
            same_shape: dict[Hashable, list[fx.Node]] = defaultdict(list)
            for n in linears:
                if n not in taken:
                    weight_shape = shape(arg(n, 1, "weight"))
                    # str(): a dynamic size is keyed by its symbol (equal symbols, equal sizes)
                    x_sizes = str(sizes(n.args[0]))
                    same_shape[(x_sizes, weight_shape, *_key(gm, n))].append(n)
            groups += [
                ("dot" if self._as_dot(g[0]) else "bmm", g) for g in _in_order(same_shape, min_size)
            ]
        return [self._site(kind, g) for kind, g in groups]

    def _site(self, kind: str, group: list[fx.Node]) -> Site:
        how = {
            "concat": "one linear on the shared input",
            "bmm": "one bmm",
            "dot": "one batched dot product",
        }[kind]
        return make_site(self.name, group, f"{len(group)} linears -> {how}", kind=kind)

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        linears = self.nodes_of(gm, site)
        if all(n.args[0] is linears[0].args[0] for n in linears):
            _concat(gm, linears)
        else:
            _batched(gm, linears, dot=self._as_dot(linears[0]))

    def _as_dot(self, linear: fx.Node) -> bool:
        """Whether a group of `linear`'s shape becomes a batched dot product: one output each,
        with the `dot` option on. `find_sites` names the site by it and `rewrite` builds it."""
        return self.options["dot"] and shape(arg(linear, 1, "weight"))[0] == 1


def _cat_nodes(graph: fx.Graph, nodes: list[fx.Node]) -> fx.Node:
    return graph.call_function(aten.cat.default, (nodes,))


def _stack_nodes(graph: fx.Graph, nodes: list[fx.Node]) -> fx.Node:
    return graph.call_function(aten.stack.default, (nodes,))


def _stack_t_nodes(graph: fx.Graph, nodes: list[fx.Node]) -> fx.Node:
    return graph.call_function(aten.transpose.int, (_stack_nodes(graph, nodes), 1, 2))


def _stack_rows_nodes(graph: fx.Graph, nodes: list[fx.Node]) -> fx.Node:
    return graph.call_function(aten.unsqueeze.default, (_stack_nodes(graph, nodes), 1))


def _weight_nodes(
    gm: fx.GraphModule,
    linears: list[fx.Node],
    stem: str,
    weight: Callable[[], torch.Tensor],
    bias: Callable[[], torch.Tensor] | None,
    how: tuple[GraphBuild, GraphBuild],
) -> tuple[fx.Node, fx.Node | None]:
    """The fused weight and bias: constants at inference; in training built per step from the
    original parameters (`how`: weight and bias builders), which stay the trainable leaves."""
    graph = gm.graph
    with graph.inserting_before(topo_first(linears)):
        weights = [arg(n, 1, "weight") for n in linears]
        w_node = derived_weight(gm, weights, stem, weight, how[0])
        b_node = None
        if bias is not None:
            biases = [arg(n, 2, "bias") for n in linears]
            b_node = derived_weight(gm, biases, stem + "_bias", bias, how[1])
    return w_node, b_node


def _concat(gm: fx.GraphModule, linears: list[fx.Node]) -> None:
    """Shared input: concatenate the weights along the output features, split the result."""
    pairs = [_weights(gm, n) for n in linears]
    has_bias = pairs[0][1] is not None
    stem = str(arg(linears[0], 1, "weight").target).removeprefix("fxtune_") + "_hcat"
    w_node, b_node = _weight_nodes(
        gm,
        linears,
        stem,
        lambda: torch.cat([w for w, _ in pairs]),
        (lambda: torch.cat([b for _, b in pairs if b is not None])) if has_bias else None,
        (_cat_nodes, _cat_nodes),
    )
    graph = gm.graph
    with graph.inserting_before(topo_first(linears)):
        fused = graph.call_function(aten.linear.default, (linears[0].args[0], w_node, b_node))
        sizes = [w.shape[0] for w, _ in pairs]
        split = graph.call_function(aten.split_with_sizes.default, (fused, sizes, -1))
    _replace_with_pieces(linears, split)


def _batched(gm: fx.GraphModule, linears: list[fx.Node], dot: bool) -> None:
    """Same shapes, different inputs: x_i @ W_i^T + b_i for all i as one (N, M, in) bmm, or
    with one output each, as (N, M, in) * (N, 1, in) summed over `in`."""
    pairs = [_weights(gm, n) for n in linears]
    has_bias = pairs[0][1] is not None
    n, (out_features, in_features) = len(linears), pairs[0][0].shape
    stem = str(arg(linears[0], 1, "weight").target).removeprefix("fxtune_")
    stem += "_hdot" if dot else "_hbmm"
    w_node, b_node = _weight_nodes(
        gm,
        linears,
        stem,
        (
            (lambda: torch.stack([w for w, _ in pairs]))
            if dot
            else (lambda: torch.stack([w.t() for w, _ in pairs]))
        ),
        (
            (lambda: torch.stack([b for _, b in pairs if b is not None]).unsqueeze(1))
            if has_bias
            else None
        ),
        (_stack_nodes if dot else _stack_t_nodes, _stack_rows_nodes),
    )
    x_shape = sizes(linears[0].args[0])
    dynamic = any(is_symbolic(s) for s in x_shape)
    # With a dynamic leading size the flattened rows are -1 and the output shape is read at
    # run time (sym_size), so the rewrite serves every size the program serves.
    flat_shape = [n, -1 if dynamic else math.prod(int(s) for s in x_shape[:-1]), in_features]
    reshape = len(x_shape) != 2
    graph = gm.graph
    with graph.inserting_after(topo_last(linears)):
        leading = size_args(graph, linears[0].args[0])[:-1]
        flat = graph.call_function(aten.stack.default, ([m.args[0] for m in linears],))
        if reshape:
            flat = graph.call_function(aten.view.default, (flat, flat_shape))
        if dot:
            products = graph.call_function(aten.mul.Tensor, (flat, w_node))
            out = graph.call_function(aten.sum.dim_IntList, (products, [-1], True))
            if b_node is not None:
                out = graph.call_function(aten.add.Tensor, (out, b_node))
        elif b_node is not None:
            out = graph.call_function(aten.baddbmm.default, (b_node, flat, w_node))
        else:
            out = graph.call_function(aten.bmm.default, (flat, w_node))
        pieces = graph.call_function(aten.unbind.int, (out, 0))
    out_shape = [*leading, out_features]
    for i, linear in enumerate(linears):
        with graph.inserting_after(pieces):
            piece = graph.call_function(operator.getitem, (pieces, i))
        if reshape:
            with graph.inserting_after(piece):
                piece = graph.call_function(aten.view.default, (piece, out_shape))
        linear.replace_all_uses_with(piece)
        graph.erase_node(linear)


def _replace_with_pieces(linears: list[fx.Node], split: fx.Node) -> None:
    """Each linear becomes its slice of the fused output.

    The slices are strided views, so a `view` that merges the feature dim with another one would
    fail on them; such users get a contiguous copy.
    """
    graph = split.graph
    total = sum(int(sizes(n)[-1]) for n in linears)
    for i, linear in enumerate(linears):
        with graph.inserting_after(split):
            piece = graph.call_function(operator.getitem, (split, i))
        if any(is_symbolic(s) for s in sizes(linear)):
            # Whether a view fits the slice's strides can change with the size: copy for views.
            blocked = [u for u in linear.users if _is_view(u)]
        else:
            strides = _strides((*shape(linear)[:-1], total))
            blocked = [u for u in linear.users if not _viewable(u, shape(linear), strides)]
        if blocked:
            with graph.inserting_after(piece):
                dense = graph.call_function(aten.contiguous.default, (piece,))
            for user in blocked:
                user.replace_input_with(linear, dense)
        linear.replace_all_uses_with(piece)
        graph.erase_node(linear)


def _strides(sizes: tuple[int, ...]) -> tuple[int, ...]:
    out, step = [], 1
    for size in reversed(sizes):
        out.append(step)
        step *= size
    return tuple(reversed(out))


def _is_view(user: fx.Node) -> bool:
    return is_call(user, aten.view.default, aten._unsafe_view.default)


def _viewable(user: fx.Node, dims: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    if not _is_view(user):
        return True
    probe = torch.empty_strided(dims, strides, device="meta")
    try:
        probe.view(user.args[1])
    except RuntimeError:
        return False
    return True
