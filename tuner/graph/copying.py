"""Deep copies of modules that hold FX graphs, without torch's LeafSpec deprecation warning.

torch 2.13 deprecates constructing `LeafSpec` (a FutureWarning, shown to users by default), and
`copy.deepcopy` of an unlifted GraphModule constructs new ones twice over: from the module's
`_in_spec`/`_out_spec`, and inside `Graph.__deepcopy__`, which copies the graph's pytree codegen
without the memo. Every `fxtune tune` printed that warning. Tree specs are immutable, so a copy
may share them: each graph is copied here as `Graph.__deepcopy__` copies it, but with a codegen
that shares its specs, and both reach `copy.deepcopy` through its memo.
"""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch
from torch import fx

from tuner.host.torch_compat import pytree

T = TypeVar("T")


def deep_copy(obj: T) -> T:
    """`copy.deepcopy(obj)`, sharing the tree specs of the FX graphs inside it."""
    if not isinstance(obj, torch.nn.Module):
        return copy.deepcopy(obj)
    memo: dict[Any, Any] = {}
    for module in obj.modules():
        for value in vars(module).values():
            if isinstance(value, pytree.TreeSpec):
                memo[id(value)] = value
        if isinstance(module, fx.GraphModule) and id(module.graph) not in memo:
            memo[id(module.graph)] = _graph_copy(module.graph, memo)
    return copy.deepcopy(obj, memo)


def _graph_copy(graph: fx.Graph, memo: dict[Any, Any]) -> fx.Graph:
    """What `Graph.__deepcopy__` builds: the nodes copied into `memo` (old node -> new node, as
    torch keys it) and the output node's meta; the codegen shallow-copied instead."""
    new = fx.Graph(tracer_cls=graph._tracer_cls)
    copied = new.graph_copy(graph, val_map=memo, return_output_node=True)
    codegen = copy.copy(graph._codegen)
    info = getattr(codegen, "pytree_info", None)
    if info is not None:
        codegen.pytree_info = info._replace(orig_args=list(info.orig_args))
    new.set_codegen(codegen)
    if copied is not None:
        value, old_output = copied
        output = new.output(value, type_expr=getattr(old_output, "type", None))
        output.meta = copy.copy(old_output.meta)
    return new
