import functools
import operator
from typing import Any

import pytest
import torch
from torch import fx, nn
from torch.export import ExportedProgram

from tuner.graph.capture import export_module, to_graph_module
from tuner.graph.sites import Site, structural_id
from tuner.passes import get_pass, pass_names
from tuner.passes.apply import apply_steps
from tuner.passes.base import GraphPass
from tuner.search.extract import (
    external_inputs,
    extract_site,
    find_same_site,
    record_values,
)


class Zoo(nn.Module):
    """A little of everything the passes look for, so each registered pass finds a site."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.2)
        self.fc = nn.Linear(8, 32)
        self.heads = nn.ModuleList(nn.Linear(32, 32) for _ in range(3))
        self.norms = nn.ModuleList(nn.LayerNorm(8) for _ in range(4))
        self.bags = nn.ModuleList(nn.EmbeddingBag(10, 32, mode="sum") for _ in range(2))

    def forward(self, x: torch.Tensor, *sparse: torch.Tensor) -> torch.Tensor:
        h = self.drop(torch.relu(self.bn(self.conv(x))))
        v = self.fc(h.mean(dim=(2, 3)))
        q, k, w = (head(v) for head in self.heads)
        normed = [n(p) for n, p in zip(self.norms, torch.split(q, 8, dim=-1), strict=True)]
        squashed = [torch.tanh(p) for p in torch.split(k, 8, dim=-1)]
        same = torch.cat(torch.split(w, 8, dim=-1), dim=-1)
        bags = sum(bag(sparse[2 * i], sparse[2 * i + 1]) for i, bag in enumerate(self.bags))
        return torch.cat(normed, dim=-1) * torch.cat(squashed, dim=-1) + same + bags


@functools.cache
def _zoo_program() -> tuple[ExportedProgram, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    net = Zoo().eval()
    with torch.no_grad():
        net.bn.running_mean.uniform_(-1, 1)
        net.bn.running_var.uniform_(0.5, 2)
    sparse = (torch.tensor([1, 7, 3, 3, 9]), torch.tensor([0, 2]))
    inputs = (torch.randn(2, 3, 6, 6), *sparse, torch.tensor([4, 0, 2]), torch.tensor([0, 1]))
    return export_module(net, inputs), inputs


def _zoo() -> tuple[fx.GraphModule, tuple[torch.Tensor, ...]]:
    program, inputs = _zoo_program()
    return to_graph_module(program), inputs


def _node(gm: fx.GraphModule, name: str) -> fx.Node:
    return next(n for n in gm.graph.nodes if n.name == name)


def test_record_values_keeps_named_nodes_only() -> None:
    gm, inputs = _zoo()
    out_node = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    first_sparse = "sparse_0"
    values = record_values(gm, inputs, [out_node.name, first_sparse])
    assert set(values) == {out_node.name, first_sparse}
    torch.testing.assert_close(values[out_node.name], gm(*inputs))
    assert torch.equal(values[first_sparse], inputs[1])
    with pytest.raises(KeyError, match="nope"):
        record_values(gm, inputs, ["nope"])


def test_extracted_linear_reproduces_parent_values_with_copied_weights() -> None:
    gm, inputs = _zoo()
    linear = "linear"  # the first linear (fc), fed by the mean over the conv features
    needed = external_inputs(gm, [linear])
    assert len(needed) == 1
    values = record_values(gm, inputs, [*needed, linear])
    site = extract_site(gm, [linear], values)

    assert site.input_names == needed
    assert site.output_names == [linear]
    (out,) = site()
    torch.testing.assert_close(out, values[linear])
    assert all("val" in n.meta for n in site.gm.graph.nodes)
    weights = [n for n in site.gm.graph.nodes if n.op == "get_attr"]
    assert len(weights) == 2
    assert not any(n.op == "placeholder" and "weight" in n.name for n in site.gm.graph.nodes)

    parent_weight = gm.get_parameter("fc.weight")
    before = parent_weight.detach().clone()
    with torch.no_grad():
        for w in site.gm.parameters():
            w.zero_()
    assert torch.equal(parent_weight, before)


def test_tuple_valued_inputs_and_several_outputs() -> None:
    gm, inputs = _zoo()
    split = "split"
    items = [u.name for u in _node(gm, split).users if u.target is operator.getitem]
    norms = [next(iter(_node(gm, i).users)).name for i in items]
    members = [*items, *norms]
    values = record_values(gm, inputs, [*external_inputs(gm, members), *members])
    site = extract_site(gm, members, values)

    assert site.input_names == [split]
    assert isinstance(site.inputs[0], (tuple, list))
    assert site.output_names == norms
    for name, got in zip(site.output_names, site(), strict=True):
        torch.testing.assert_close(got, values[name])
    assert structural_id("any", [_node(gm, m) for m in members]) == structural_id(
        "any", [_node(site.gm, m) for m in members]
    )


def test_unpacking_of_a_member_tuple_goes_with_the_site() -> None:
    gm, inputs = _zoo()
    values = record_values(gm, inputs, external_inputs(gm, ["embedding_bag"]))
    site = extract_site(gm, ["embedding_bag"], values)
    bag = _node(site.gm, "embedding_bag")
    assert {u.target for u in bag.users} == {operator.getitem}
    assert len(bag.users) == len(_node(gm, "embedding_bag").users)
    assert site.output_names == [_node(gm, "add").args[0].name]


def test_inputs_keep_the_layout_they_had_in_the_parent() -> None:
    gm, inputs = _zoo()
    values = record_values(gm, inputs, external_inputs(gm, ["tanh"]))
    site = extract_site(gm, ["tanh"], values)
    (piece,) = site.inputs
    assert piece.shape == (2, 8) and piece.stride() == (32, 1)
    assert site.gm.graph.find_nodes(op="placeholder")[0].meta["val"].stride() == (32, 1)
    assert site.clone().inputs[0].stride() == (32, 1)


def test_rejects_bad_requests() -> None:
    gm, _ = _zoo()
    with pytest.raises(KeyError, match="record_values"):
        extract_site(gm, ["linear"], {})
    with pytest.raises(ValueError, match="placeholder"):
        extract_site(gm, ["x"], {})


# The zoo has no collectives: this pass's sites need a process group (tests/tuner/distributed).
NEEDS_COLLECTIVES = {"overlap_comm_compute"}


def test_zoo_triggers_the_reference_pass() -> None:
    gm, _ = _zoo()
    assert get_pass("remove_dropout").find_sites(gm)


# By pass name, not by site: finding the sites exports the zoo, which collection should not do
# (every xdist worker collects every file).
@pytest.mark.parametrize("pass_name", [n for n in pass_names() if n not in NEEDS_COLLECTIVES])
def test_pass_finds_the_same_site_in_the_extracted_module(pass_name: str) -> None:
    gm, inputs = _zoo()
    graph_pass = get_pass(pass_name)
    sites = graph_pass.find_sites(gm)
    assert sites, f"the zoo has no {pass_name} site"
    values = record_values(gm, inputs, [n.name for n in gm.graph.nodes])
    for site in sites:
        _check_extracted_site(gm, values, graph_pass, site)


def _check_extracted_site(
    gm: fx.GraphModule, values: dict[str, Any], graph_pass: GraphPass, site: Site
) -> None:
    """Extracted, the site is found again, rewrites like in the model, and leaves `gm` as it was."""
    extracted = extract_site(gm, site.nodes, values)
    assert find_same_site(graph_pass, extracted.gm, site) is not None

    untouched = extracted.clone()
    rewritten = apply_steps(extracted.gm, extracted.inputs, [(graph_pass.name, {site.id})])
    assert [s.id for s in rewritten.applied] == [site.id]
    assert find_same_site(graph_pass, untouched.gm, site) is not None
    expected = untouched()
    got = rewritten.gm(*rewritten.inputs)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    for name, e in zip(untouched.output_names, expected, strict=True):
        torch.testing.assert_close(e, values[name])
    assert find_same_site(graph_pass, gm, site) is not None
