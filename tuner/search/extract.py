"""Cutting a site out of a model so it can be rewritten and timed on its own (Tuning, step 3).

Timing a candidate inside the whole model would drown a 3 % win on one site in the noise of every
other op, and re-running the model per candidate wastes the budget. So each site becomes a small
standalone module fed with the values its inputs really had in one run of the model: indices and
offsets stay valid, shapes are exact, and a pass's `find_sites` sees the same subgraph (the same
structural id) as in the parent, so the tuner can rewrite one copy and time it against another.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from tuner.graph.capture import refresh_meta
from tuner.graph.copying import deep_copy
from tuner.graph.nodes import TRAIN_KEY, is_training
from tuner.graph.sites import Site
from tuner.host.torch_compat import pytree
from tuner.passes.base import GraphPass


def _copy_tensor(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same strides, so the site is timed on the layout it really gets.

    A split piece is a strided view; clone() would make it contiguous (and faster to read).
    Whether it carried a gradient is kept: a training site's run differentiates to it.
    """
    carries = t.requires_grad
    t = t.detach()
    try:
        out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
        out.copy_(t)
    except RuntimeError:
        out = t.clone()  # overlapping strides (expand) cannot be written to
    return out.requires_grad_(carries)


def _detached_copy(value: Any) -> Any:
    """A copy that later in-place ops of the run cannot change behind our back."""
    return pytree.tree_map(lambda v: _copy_tensor(v) if isinstance(v, torch.Tensor) else v, value)


class _Recorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, names: Collection[str]) -> None:
        super().__init__(gm)
        self.wanted = set(names)
        self.values: dict[str, Any] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if n.name in self.wanted:
            self.values[n.name] = _detached_copy(result)
        return result


def record_values(
    gm: fx.GraphModule, inputs: tuple, names: Collection[str], *, grad: bool = False
) -> dict[str, Any]:
    """Run gm once on inputs (torch.fx.Interpreter) and keep the values of the named nodes.

    One run serves every site: ask for the union of their `external_inputs`. With `grad`
    (a training step) autograd is on, and a kept value requires grad where it carried one in
    the step: a site's backward reaches exactly those of its inputs, as in the step.
    """
    known = {n.name for n in gm.graph.nodes}
    missing = set(names) - known
    if missing:
        raise KeyError(f"no nodes named {sorted(missing)} in the graph")
    recorder = _Recorder(gm, names)
    with torch.inference_mode(False), torch.set_grad_enabled(grad):
        recorder.run(*inputs)
    return recorder.values


@dataclass
class SiteModule:
    """A site as its own module, with the inputs it saw inside the parent model."""

    gm: fx.GraphModule
    inputs: tuple
    input_names: list[str]
    output_names: list[str]

    def __call__(self) -> Any:
        return self.gm(*self.inputs)

    def clone(self) -> SiteModule:
        """An independent copy (weights included) for a candidate rewrite to mutate."""
        return SiteModule(
            deep_copy(self.gm),
            _detached_copy(self.inputs),
            list(self.input_names),
            list(self.output_names),
        )


def _members(gm: fx.GraphModule, node_names: Sequence[str]) -> list[fx.Node]:
    by_name = {n.name: n for n in gm.graph.nodes}
    missing = [name for name in node_names if name not in by_name]
    if missing:
        raise KeyError(f"no nodes named {missing} in the graph")
    chosen = {by_name[name] for name in node_names}
    bad = [n.name for n in chosen if n.op in ("placeholder", "output")]
    if bad:
        raise ValueError(f"a site cannot contain placeholder or output nodes: {bad}")
    return [n for n in gm.graph.nodes if n in chosen]


def _externals(members: Sequence[fx.Node]) -> list[fx.Node]:
    """Nodes outside the site that it reads, in the order the site first reads them."""
    inside = set(members)
    seen: dict[fx.Node, None] = {}
    for node in members:
        for source in node.all_input_nodes:
            if source not in inside:
                seen.setdefault(source, None)
    return list(seen)


def _projections(members: Sequence[fx.Node]) -> list[fx.Node]:
    """`getitem`s outside the site that unpack a member's tuple, used or not.

    They go with the site so that passes which inspect how a multi-output op is unpacked
    (embedding_bag, split) see the same users as in the parent; the pieces become the outputs.
    """
    inside = set(members)
    return [
        user
        for node in members
        for user in node.users
        if user not in inside and user.op == "call_function" and user.target is operator.getitem
    ]


def external_inputs(gm: fx.GraphModule, node_names: Sequence[str]) -> list[str]:
    """Names of the non-weight nodes a site reads from outside: what `record_values` must keep."""
    return [n.name for n in _externals(_members(gm, node_names)) if n.op != "get_attr"]


def _fetch_attr(gm: fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _copy_attr(obj: Any) -> Any:
    if isinstance(obj, torch.nn.Parameter):
        return torch.nn.Parameter(obj.detach().clone(), requires_grad=obj.requires_grad)
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    return deep_copy(obj)


def extract_site(
    gm: fx.GraphModule, node_names: Sequence[str], values: Mapping[str, Any]
) -> SiteModule:
    """The subgraph formed by node_names as its own module; returns a tuple of the outputs.

    Node names are kept, so the site found in the extracted module names the same nodes as in
    the parent. Weights the site reads stay `get_attr` (passes such as fold_conv_bn only fire on
    real weights) but are copies, so rewriting the extracted module never touches the parent.
    `values` must hold every name from `external_inputs(gm, node_names)`.
    """
    members = _members(gm, node_names)
    externals = _externals(members)
    inputs_needed = [n for n in externals if n.op != "get_attr"]
    missing = [n.name for n in inputs_needed if n.name not in values]
    if missing:
        raise KeyError(f"no recorded values for site inputs {missing}; use record_values")

    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for node in inputs_needed:
        env[node] = graph.placeholder(node.name)
        env[node].meta = copy.copy(node.meta)
    for node in externals:
        if node.op == "get_attr":
            env[node] = graph.create_node("get_attr", node.target, name=node.name)
            env[node].meta = copy.copy(node.meta)
    chosen = {*members, *_projections(members)}
    copied = [n for n in gm.graph.nodes if n in chosen]
    for node in copied:
        env[node] = graph.node_copy(node, env.__getitem__)

    outputs = [n for n in copied if any(user not in chosen for user in n.users)]
    if not outputs:
        raise ValueError("the site's results are never used outside it; nothing to measure")
    graph.output(tuple(env[n] for n in outputs))

    attrs = {
        str(n.target): _copy_attr(_fetch_attr(gm, str(n.target)))
        for n in graph.nodes
        if n.op in ("get_attr", "call_module")
    }
    site_gm = fx.GraphModule(attrs, graph, class_name="SiteModule")
    # A site of a training step is rewritten as one: its parameters stay the trainable leaves.
    site_gm.meta[TRAIN_KEY] = is_training(gm)
    inputs = tuple(_detached_copy(values[n.name]) for n in inputs_needed)
    refresh_meta(site_gm, inputs)
    return SiteModule(site_gm, inputs, [n.name for n in inputs_needed], [n.name for n in outputs])


def find_same_site(graph_pass: GraphPass, gm: fx.GraphModule, site: Site) -> Site | None:
    """The site in `gm` (usually an extracted module) with the id and nodes of `site`."""
    for found in graph_pass.find_sites(gm):
        if found.id == site.id and found.nodes == site.nodes:
            return found
    return None
