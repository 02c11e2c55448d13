"""Fold an inference batch norm into the convolution before it.

In eval mode batch norm is a per-channel affine map with frozen statistics, so it can be baked
into the conv's weight and bias: one kernel and one pass over the activation disappear.
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
    mutated_aliases,
    only_user,
)
from tuner.graph.sites import Site, make_site
from tuner.passes import register
from tuner.passes.base import GraphPass

CONVS = (
    aten.conv1d.default,
    aten.conv1d.padding,
    aten.conv2d.default,
    aten.conv2d.padding,
    aten.conv3d.default,
    aten.conv3d.padding,
)


def _is_attr_or_none(node: Any) -> bool:
    return node is None or (isinstance(node, fx.Node) and node.op == "get_attr")


def _params(conv: fx.Node, bn: fx.Node) -> list[Any]:
    """Conv weight and bias, then batch norm weight, bias, running mean and running variance."""
    return [arg(conv, 1, "weight"), arg(conv, 2, "bias")] + [
        arg(bn, i, name) for i, name in enumerate(("weight", "bias", "mean", "var"), start=1)
    ]


def _foldable(gm: fx.GraphModule, conv: fx.Node, bn: fx.Node, mutated: set[str]) -> bool:
    if not is_call(bn, aten.batch_norm.default) or bn.args[0] is not conv:
        return False
    if arg(bn, 5, "training") is not False:
        return False
    params = _params(conv, bn)
    conv_w, _, _, _, mean, var = params
    if conv_w is None or mean is None or var is None:
        return False
    if not all(_is_attr_or_none(p) for p in params):
        return False
    nodes = [p for p in params if p is not None]
    if any(str(p.target) in mutated for p in nodes):
        return False
    tensors = [attr_tensor(gm, p) for p in nodes]
    if any(t is None for t in tensors):
        return False
    dtypes = {t.dtype for t in tensors if t is not None}
    return len(dtypes) == 1 and next(iter(dtypes)).is_floating_point


def _folded(gm: fx.GraphModule, conv: fx.Node, bn: fx.Node) -> tuple[torch.Tensor, torch.Tensor]:
    """The folded weight and bias, computed in float64 so folding adds no rounding of its own."""
    conv_w, conv_b, gamma, beta, mean, var = (
        attr_tensor(gm, p) if p is not None else None for p in _params(conv, bn)
    )
    assert conv_w is not None and mean is not None and var is not None
    dtype = conv_w.dtype
    eps = float(arg(bn, 7, "eps"))
    w = conv_w.double()
    out_channels = w.shape[0]
    scale = torch.rsqrt(var.double() + eps)
    if gamma is not None:
        scale = scale * gamma.double()
    bias = (
        conv_b.double()
        if conv_b is not None
        else torch.zeros(out_channels, dtype=torch.float64, device=w.device)
    )
    bias = (bias - mean.double()) * scale
    if beta is not None:
        bias = bias + beta.double()
    weight = w * scale.reshape(out_channels, *([1] * (w.dim() - 1)))
    return weight.to(dtype), bias.to(dtype)


@register
class FoldConvBn(GraphPass):
    name = "fold_conv_bn"
    description = "Fold eval-mode batch norm into the preceding conv's weight and bias."
    # Folding bakes conv and norm weights into constants (no gradient reaches them), and a
    # batch norm in training uses batch statistics: never in training.
    train_safe = False

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        mutated = {str(n.target) for n in mutated_aliases(gm) if n.op == "get_attr"}
        sites = []
        for conv in gm.graph.nodes:
            if not is_call(conv, *CONVS):
                continue
            bn = only_user(conv)
            if bn is not None and _foldable(gm, conv, bn, mutated):
                sites.append(make_site(self.name, [conv, bn], f"{conv.target} + batch_norm"))
        return sites

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        conv, bn = self.nodes_of(gm, site)
        weight, bias = _folded(gm, conv, bn)
        stem = str(arg(conv, 1, "weight").target).removeprefix("fxtune_")
        graph = gm.graph
        with graph.inserting_before(conv):
            w_node = graph.get_attr(add_weight(gm, stem + "_folded", weight))
            b_node = graph.get_attr(add_weight(gm, stem + "_folded_bias", bias))
            args = (conv.args[0], w_node, b_node, *conv.args[3:])
            kwargs = {k: v for k, v in conv.kwargs.items() if k not in ("weight", "bias")}
            fused = graph.call_function(conv.target, args, kwargs)
        bn.replace_all_uses_with(fused)
        graph.erase_node(bn)
        graph.erase_node(conv)
