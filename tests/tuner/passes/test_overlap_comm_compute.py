"""overlap_comm_compute on real exported collectives (a one-rank gloo group in this process;
the two- and four-rank runs are in tests/examples/test_sharded.py and test_distributed_tune.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import fx, nn

from examples.sharded import ShardedConfig, global_inputs, rank_inputs, rank_module
from tuner.graph.capture import export_module, to_graph_module
from tuner.passes import get_pass, pass_names
from tuner.passes.apply import apply_steps

PASS = "overlap_comm_compute"


@pytest.fixture(scope="module")
def group() -> Iterator[None]:
    """A real one-rank gloo group: export records the collective exactly as with N ranks."""
    store = dist.HashStore()
    dist.init_process_group(
        "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30)
    )
    yield
    dist.destroy_process_group()


def positions(gm: fx.GraphModule) -> dict[str, int]:
    return {n.name: i for i, n in enumerate(gm.graph.nodes)}


def ops_between(gm: fx.GraphModule, first: str, last: str) -> list[str]:
    nodes = list(gm.graph.nodes)
    at = positions(gm)
    return [str(n.target) for n in nodes[at[first] + 1 : at[last]] if n.op == "call_function"]


def sharded_gm(cfg: ShardedConfig) -> tuple[fx.GraphModule, tuple[torch.Tensor, ...]]:
    inputs = rank_inputs(cfg, global_inputs(cfg, 1), 0)
    return to_graph_module(export_module(rank_module(cfg, 0), inputs)), inputs


@pytest.mark.usefixtures("group")
def test_export_records_request_then_wait_right_after() -> None:
    gm, _ = sharded_gm(ShardedConfig(world_size=1, tables=2, batch=64))
    assert ops_between(gm, "all_to_all_single", "wait_tensor") == []


@pytest.mark.usefixtures("group")
def test_wait_moves_past_the_dense_arm_outputs_equal() -> None:
    cfg = ShardedConfig(world_size=1, tables=2, batch=64)
    gm, inputs = sharded_gm(cfg)
    with torch.no_grad():
        before = gm(*inputs)
    (site,) = get_pass(PASS).find_sites(gm)
    assert site.nodes == ("all_to_all_single", "wait_tensor")
    result = apply_steps(gm, inputs, [(PASS, [site.id])])
    between = ops_between(result.gm, "all_to_all_single", "wait_tensor")
    # The whole dense arm (3 linears, 3 relus) now runs while the all-to-all is in flight.
    assert between.count("aten.linear.default") == 3 and between.count("aten.relu.default") == 3
    wait = next(n for n in result.gm.graph.nodes if n.name == "wait_tensor")
    assert list(wait.next.all_input_nodes) == [wait]  # just before the first use of its result
    with torch.no_grad():
        assert torch.equal(result.gm(*inputs), before)
    assert get_pass(PASS).find_sites(result.gm) == []  # nothing left to move


@pytest.mark.usefixtures("group")
def test_site_ids_are_structural() -> None:
    a, _ = sharded_gm(ShardedConfig(world_size=1, tables=2, batch=64, seed=1))
    b, _ = sharded_gm(ShardedConfig(world_size=1, tables=2, batch=64, seed=2))
    c, _ = sharded_gm(ShardedConfig(world_size=1, tables=2, batch=32))
    ids = [get_pass(PASS).find_sites(g)[0].id for g in (a, b, c)]
    assert ids[0] == ids[1] != ids[2]  # weights do not matter, shapes do


class UsedAtOnce(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        z = torch.tanh(y)  # independent, but before the request's input: nothing to move
        out = funcol.all_to_all_single(x * 2 + z.sum(), None, None, dist.group.WORLD)
        return out + 1


class InPlaceBetween(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = funcol.all_to_all_single(x * 2, None, None, dist.group.WORLD)
        z = torch.tanh(y)
        z.add_(1)
        return out + 1, z


class Independent(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x * 2
        z = torch.tanh(y)  # after the request's input, before the request: it gets hoisted
        out = funcol.all_to_all_single(a, None, None, dist.group.WORLD)
        return out + 1, z


@pytest.mark.usefixtures("group")
def test_no_site_without_independent_work() -> None:
    gm = to_graph_module(export_module(UsedAtOnce(), (torch.randn(4, 3), torch.randn(5))))
    assert get_pass(PASS).find_sites(gm) == []


@pytest.mark.usefixtures("group")
def test_no_site_when_an_op_writes_in_place_in_between() -> None:
    gm = to_graph_module(export_module(InPlaceBetween(), (torch.randn(4, 3), torch.randn(5))))
    writes = [n for n in gm.graph.nodes if n.op == "call_function" and "add_" in str(n.target)]
    if not writes:
        pytest.skip("export functionalised the in-place add; nothing writes in place")
    assert get_pass(PASS).find_sites(gm) == []


@pytest.mark.usefixtures("group")
def test_request_hoisted_above_independent_work() -> None:
    inputs = (torch.randn(4, 3), torch.randn(5))
    gm = to_graph_module(export_module(Independent(), inputs))
    with torch.no_grad():
        before = gm(*inputs)
    result = apply_steps(gm, inputs, [(PASS, None)])
    assert "aten.tanh.default" in ops_between(result.gm, "all_to_all_single", "wait_tensor")
    with torch.no_grad():
        after = result.gm(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_registered_and_silent_on_graphs_without_collectives() -> None:
    assert PASS in pass_names()
    gm = to_graph_module(
        export_module(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),))
    )
    assert get_pass(PASS).find_sites(gm) == []
