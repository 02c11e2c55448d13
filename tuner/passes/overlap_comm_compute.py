"""Overlap an all-to-all with the compute that does not need it (seed 000, section 3.3).

The seed splits "EmbeddingAllToAll" into a request and a wait and puts independent operators in
between. `torch.export` already records a functional collective as that pair:

    %a2a  = _c10d_functional.all_to_all_single(%pooled, [..], [..], "0")   # request (async)
    %wait = _c10d_functional.wait_tensor(%a2a)                              # wait

but places the wait right after the request, so the communication runs alone (figure 5(b)).
This pass moves the wait down to just before the first node that reads its result, and the
request up to just after the last node that produces its input, so every operator that does not
depend on the collective runs while it is in flight. Nodes are only reordered, never changed:
outputs are bit-for-bit equal on every rank.

Limits, each keeping the order of collectives and the meaning of the program:
- neither end crosses another collective, so every rank still issues collectives in the same
  order (a reordering of issue order across ranks deadlocks);
- a site whose in-between nodes write to any tensor in place is skipped: the collective may
  still be reading its input, or writing its output, while they run.
"""

from __future__ import annotations

import torch
from torch import fx

from tuner.graph.sites import Site, structural_id
from tuner.host.torch_compat import torch_ops
from tuner.passes import register
from tuner.passes.base import GraphPass

_c10d = torch.ops._c10d_functional
# Requests whose result is a fresh tensor completed by `wait_tensor`.
STARTS = frozenset({_c10d.all_to_all_single.default})
WAIT = _c10d.wait_tensor.default
COLLECTIVE_NAMESPACE = "_c10d_functional"


def _is_op(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch_ops.OpOverload)


def _is_collective(node: fx.Node) -> bool:
    return _is_op(node) and node.target.namespace == COLLECTIVE_NAMESPACE


def _writes(node: fx.Node) -> bool:
    """Whether the op writes to any of its arguments in place (per its schema)."""
    if not _is_op(node):
        return False
    arguments = node.target._schema.arguments
    return any(a.alias_info is not None and a.alias_info.is_write for a in arguments)


def _pair(start: fx.Node) -> fx.Node | None:
    """The wait of a request used by nothing else, or None."""
    users = list(start.users)
    if len(users) == 1 and users[0].op == "call_function" and users[0].target is WAIT:
        return users[0]
    return None


def _hoist_after(start: fx.Node, order: dict[fx.Node, int]) -> fx.Node:
    """The node the request can follow: its last input's producer, or a collective after that."""
    nodes = list(start.graph.nodes)
    floor = max((order[a] for a in start.all_input_nodes), default=0)
    for i in range(order[start] - 1, floor, -1):
        if _is_collective(nodes[i]) or nodes[i].op == "placeholder":
            return nodes[i]
    return nodes[floor]


def _sink_before(wait: fx.Node, order: dict[fx.Node, int]) -> fx.Node:
    """The node the wait can precede: its first user or the next collective after it."""
    nodes = list(wait.graph.nodes)
    ceiling = min(order[u] for u in wait.users)
    for i in range(order[wait] + 1, ceiling):
        if _is_collective(nodes[i]):
            return nodes[i]
    return nodes[ceiling]


def _plan(start: fx.Node) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """(node the request goes after, node the wait goes before, ops that will overlap) or None."""
    wait = _pair(start)
    if wait is None or not wait.users:
        return None
    order = {n: i for i, n in enumerate(start.graph.nodes)}
    after = _hoist_after(start, order)
    before = _sink_before(wait, order)
    nodes = list(start.graph.nodes)
    moved = [
        n
        for n in nodes[order[after] + 1 : order[before]]
        if n is not start and n is not wait and _is_op(n)
    ]
    already = nodes[order[start] + 1 : order[wait]]
    if not moved or len(moved) == sum(1 for n in already if _is_op(n)):
        return None
    if any(_writes(n) for n in moved):
        return None
    return after, before, moved


@register
class OverlapCommCompute(GraphPass):
    name = "overlap_comm_compute"
    # Reordering alone keeps gradients, but the backward's collectives were never checked
    # across ranks here: off in training until they are.
    train_safe = False
    description = (
        "Issue each all-to-all as early and wait for it as late as its data allows, so the "
        "operators that do not depend on it run while it is in flight (request/wait split)."
    )

    def find_sites(self, gm: fx.GraphModule) -> list[Site]:
        sites = []
        for node in gm.graph.nodes:
            if not (node.op == "call_function" and node.target in STARTS):
                continue
            plan = _plan(node)
            if plan is None:
                continue
            _, _, moved = plan
            wait = _pair(node)
            assert wait is not None
            summary = f"{node.name}: {len(moved)} independent op(s) run while it is in flight"
            site_id = structural_id(self.name, [node, wait, *moved])
            sites.append(Site(self.name, site_id, (node.name, wait.name), summary))
        return sites

    def rewrite(self, gm: fx.GraphModule, site: Site) -> None:
        start, wait = self.nodes_of(gm, site)
        plan = _plan(start)
        if plan is None or _pair(start) is not wait:
            raise LookupError(f"site {site.id} no longer applies")
        after, before, _ = plan
        after.append(start)
        before.prepend(wait)
