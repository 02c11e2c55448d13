"""Run conv chains in channels_last (NHWC) memory format on CPU.

oneDNN convolutions want NHWC activations and weights; fed NCHW tensors they reorder on every
call. This is the MKL autotuner's layout case done with memory formats instead of mkldnn
tensors: convert once where a chain of convs and layout-preserving ops starts, keep the weights
in NHWC, and convert back only where a value leaves the chain. Whether that pays off depends on
the chain's length and shapes, which is why each chain is its own site for the tuner to time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from tuner.graph.nodes import (
    add_weight,
    arg,
    aten,
    attr_tensor,
    is_call,
    is_training,
    mutated_aliases,
    mutated_nodes,
    only_user,
    tensor_val,
)
from tuner.graph.sites import Site, make_site
from tuner.passes import register
from tuner.passes.base import GraphPass

CONVS = (aten.conv2d.default, aten.conv2d.padding)

# Ops whose results do not depend on the layout of their inputs and that keep NHWC outputs.
AGNOSTIC = (
    aten.relu.default,
    aten.relu6.default,
    aten.hardtanh.default,
    aten.sigmoid.default,
    aten.tanh.default,
    aten.silu.default,
    aten.gelu.default,
    aten.mish.default,
    aten.hardswish.default,
    aten.hardsigmoid.default,
    aten.leaky_relu.default,
    aten.elu.default,
    aten.clamp.default,
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.mul.Tensor,
    aten.cat.default,
    aten.max_pool2d.default,
    aten.avg_pool2d.default,
    aten.adaptive_avg_pool2d.default,
)

# In-place forms (what `inplace=True` modules and `+=` export to); members only when they write
# a member nobody else reads.
IN_PLACE = (
    aten.relu_.default,
    aten.relu6_.default,
    aten.hardtanh_.default,
    aten.sigmoid_.default,
    aten.tanh_.default,
    aten.silu_.default,
    aten.gelu_.default,
    aten.mish_.default,
    aten.hardswish_.default,
    aten.hardsigmoid_.default,
    aten.elu_.default,
    aten.leaky_relu_.default,
    aten.clamp_.default,
    aten.add_.Tensor,
    aten.sub_.Tensor,
    aten.mul_.Tensor,
)


def _is_4d(node: Any) -> bool:
    v = tensor_val(node)
    return v is not None and v.dim() == 4


def _is_attr_or_none(node: Any) -> bool:
    return node is None or (isinstance(node, fx.Node) and node.op == "get_attr")


def _conv_ok(gm: fx.GraphModule, node: fx.Node, mutated_attrs: set[str]) -> bool:
    weight, bias = arg(node, 1, "weight"), arg(node, 2, "bias")
    if not (_is_4d(node.args[0]) and _is_attr_or_none(bias) and _is_attr_or_none(weight)):
        return False
    tensor = attr_tensor(gm, weight)
    params = [p for p in (weight, bias) if p is not None]
    return (
        tensor is not None
        and tensor.dim() == 4
        and not any(str(p.target) in mutated_attrs for p in params)
    )


def _is_member_op(gm: fx.GraphModule, node: fx.Node, mutated_attrs: set[str]) -> bool:
    if not _is_4d(node):
        return False
    if is_call(node, *CONVS):
        return _conv_ok(gm, node, mutated_attrs)
    if is_call(node, aten.batch_norm.default):
        return arg(node, 5, "training") is False
    return is_call(node, *AGNOSTIC)


def _members(gm: fx.GraphModule, aliased: set[fx.Node]) -> set[fx.Node]:
    """Nodes that may run in NHWC, with in-place writes allowed only on private member values.

    A member's value leaves the chain as a copy, so a write or view outside the chain would miss
    the readers inside it. Writes are safe only where the writer is the value's sole reader.
    """
    mutated = mutated_nodes(gm)
    mutated_attrs = {str(n.target) for n in aliased if n.op == "get_attr"}
    members: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if is_call(node, *IN_PLACE):
            written = node.args[0]
            if written in members and only_user(written) is node and _is_4d(node):
                members.add(node)
        elif node.op == "call_function" and _is_member_op(gm, node, mutated_attrs):
            members.add(node)

    def private(n: fx.Node) -> bool:
        if n not in aliased or (n in mutated and only_user(n) is not None):
            return True
        return is_call(n, *IN_PLACE) and not any(u in aliased for u in n.users)

    return {n for n in members if private(n)}


def _components(members: set[fx.Node]) -> list[list[fx.Node]]:
    parent = {n: n for n in members}

    def find(n: fx.Node) -> fx.Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for node in members:
        for source in node.all_input_nodes:
            if source in members:
                parent[find(source)] = find(node)
    groups: dict[fx.Node, list[fx.Node]] = {}
    for node in members:
        groups.setdefault(find(node), []).append(node)
    return list(groups.values())


def _activation_inputs(node: fx.Node) -> list[fx.Node]:
    """Inputs that carry activations into `node` (a conv's weight and bias are not among them)."""
    if is_call(node, *CONVS):
        return [node.args[0]]
    return [a for a in node.all_input_nodes if _is_4d(a)]


def _entries(chain: set[fx.Node]) -> set[fx.Node]:
    return {a for n in chain for a in _activation_inputs(n) if a not in chain}


def _to_format(graph: fx.Graph, node: fx.Node, memory_format: torch.memory_format) -> fx.Node:
    return graph.call_function(aten.contiguous.default, (node,), {"memory_format": memory_format})


@register
class ChannelsLast(GraphPass):
    name = "channels_last"
    # In training the NHWC weight is a per-step copy of the parameter (differentiable), not a
    # constant, so the gradient still reaches the original weight.
    train_safe = True
    description = "Run chains of 4-D convs and layout-agnostic ops in channels_last on CPU."
    default_options = {"min_convs": 1}

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        aliased = mutated_aliases(gm)
        sites = []
        for chain in _components(_members(gm, aliased)):
            convs = sum(1 for n in chain if is_call(n, *CONVS))
            if convs < self.options["min_convs"] or _entries(set(chain)) & aliased:
                continue
            summary = f"channels_last chain: {convs} conv2d, {len(chain)} ops"
            sites.append(make_site(self.name, chain, summary))
        order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
        return sorted(sites, key=lambda s: order[s.nodes[0]])

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        chain = self.nodes_of(gm, site)
        members = set(chain)
        graph = gm.graph
        converted: dict[fx.Node, fx.Node] = {}
        for node in chain:
            if is_call(node, *CONVS):
                weight = arg(node, 1, "weight")
                if weight not in converted:
                    converted[weight] = self._nhwc_weight(gm, weight, node)
                node.replace_input_with(weight, converted[weight])
            for source in _activation_inputs(node):
                if source in members:
                    continue
                if source not in converted:
                    with graph.inserting_before(node):
                        converted[source] = _to_format(graph, source, torch.channels_last)
                node.replace_input_with(source, converted[source])
        for node in chain:
            if all(user in members for user in node.users):
                continue
            with graph.inserting_after(node):
                back = _to_format(graph, node, torch.contiguous_format)
            node.replace_all_uses_with(
                back, delete_user_cb=lambda u, back=back: u not in members and u is not back
            )

    @staticmethod
    def _nhwc_weight(gm: fx.GraphModule, weight_node: fx.Node, conv: fx.Node) -> fx.Node:
        if is_training(gm):
            with gm.graph.inserting_before(conv):
                return _to_format(gm.graph, weight_node, torch.channels_last)
        weight = attr_tensor(gm, weight_node)
        assert weight is not None
        name = add_weight(gm, str(weight_node.target).removeprefix("fxtune_") + "_nhwc", weight)
        # add_weight stores contiguous (NCHW) copies; the point here is the NHWC strides.
        gm.register_buffer(name, weight.detach().contiguous(memory_format=torch.channels_last))
        with gm.graph.inserting_before(conv):
            return gm.graph.get_attr(name)
