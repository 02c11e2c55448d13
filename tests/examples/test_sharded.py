"""The sharded example on 2 and 4 real gloo ranks equals the unsharded model, eager and exported."""

from __future__ import annotations

import pytest
import torch

from examples.sharded import (
    Reference,
    export_rank,
    global_inputs,
    rank_inputs,
    rank_module,
    reference_slice,
)
from tests.sharded_helpers import small
from tuner.distributed.ranks import run_ranks


def sharded_outputs(rank: int, world_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    cfg = small(world_size)
    inputs = rank_inputs(cfg, global_inputs(cfg, seed), rank)
    with torch.no_grad():
        eager = rank_module(cfg, rank)(*inputs)
        exported = export_rank(cfg, rank).module()(*inputs)
    return eager, exported


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_equal_the_unsharded_model(world_size: int) -> None:
    cfg = small(world_size)
    with torch.no_grad():
        expected = Reference(cfg)(*global_inputs(cfg, 3))
    outs = run_ranks(sharded_outputs, world_size, 3, backend="gloo", collective_timeout_s=60)
    for rank, (eager, exported) in enumerate(outs):
        want = reference_slice(cfg, expected, rank)
        torch.testing.assert_close(eager, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(exported, want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(outs[0][0], outs[1][0])  # each rank computes its own rows


def test_shards_hold_distinct_tables() -> None:
    a, b = rank_module(small(2), 0), rank_module(small(2), 1)
    assert not torch.equal(a.tables[0].weight, b.tables[0].weight)
    assert torch.equal(a.dense_arm[0].weight, b.dense_arm[0].weight)  # replicated arms
    ref = Reference(small(2))
    assert torch.equal(b.tables[0].weight, ref.tables[2].weight)
