"""Every op a program runs is priced by a rule, torch's FLOP formula, its tags or as a view, or
refused: the registry's rules, on meta tensors (no data, no compute)."""

from __future__ import annotations

import math

import pytest
import torch

from tuner.loading import op_costs
from tuner.loading.op_costs import (
    COST_RULES,
    ELEMENT,
    HOP_RULES,
    MATRIX,
    SORT,
    Call,
    UnpricedOpError,
    cost_rule,
    node_cost,
)

aten = torch.ops.aten


def meta(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


def price(op: object, *args: object, **kwargs: object) -> float:
    """One call of `op` run on meta under the pricing mode: each op it dispatches, priced."""
    mode = op_costs._pricing_mode()()
    with mode:
        op(*args, **kwargs)
    return mode.total


def test_a_sort_costs_n_log_n_where_the_flop_counter_counted_zero() -> None:
    n = 2**20
    x = meta(n)
    values, indices = meta(n), meta(n, dtype=torch.int64)
    cost = node_cost("sort", aten.sort.default, (x,), {}, (values, indices))
    assert cost == pytest.approx(SORT * n * 20 + ELEMENT * 3 * n)
    assert price(aten.sort.default, x) == cost  # run on meta: the same rule, the same outputs
    assert price(aten.argsort.default, x) == cost  # a composite: priced by the sort it runs


def test_pointwise_ops_and_reductions_cost_their_traffic_and_views_nothing() -> None:
    x, y = meta(64, 64), meta(64, 64)
    assert price(aten.add.Tensor, x, y) == ELEMENT * 3 * 4096
    assert price(aten.sum.default, x) == ELEMENT * (4096 + 1)
    assert price(aten.view.default, x, [4096]) == 0
    assert price(aten.expand.default, meta(1, 64), [4096, 64]) == 0
    assert price(aten.squeeze_.dim, meta(1, 64), 0) == 0  # an in-place view changes sizes only
    assert price(aten.clone.default, x) == ELEMENT * 2 * 4096


def test_in_place_ops_and_prims_are_priced_as_the_aten_op_of_their_name() -> None:
    x, y = meta(64, 64), meta(64, 64)
    assert cost_rule(aten.add_.Tensor)(Call(aten.add_.Tensor, (x, y), {}, x)) == ELEMENT * 3 * 4096
    assert cost_rule(aten.gt_.Scalar) is not None
    assert cost_rule(torch.ops.prims.sin.default) is not None
    a = meta(256, 256)
    assert cost_rule(aten.addmm_.default)(Call(aten.addmm_.default, (a, a, a), {}, a)) == 2 * 256**3


def test_torchs_flop_formula_prices_a_matmul_at_least_at_its_traffic() -> None:
    assert price(aten.mm.default, meta(256, 256), meta(256, 256)) == 2 * 256**3
    thin = price(aten.mm.default, meta(4096, 1), meta(1, 4096))  # an outer product
    assert thin == ELEMENT * (4096 + 4096 + 4096**2)


def test_matrix_functions_cost_n_cubed_per_matrix_times_the_batch() -> None:
    a = meta(4, 256, 256)
    inverse = price(aten.linalg_inv_ex.default, a)
    assert inverse >= MATRIX * 4 * 256**3
    assert price(aten.linalg_inv_ex.default, meta(8, 256, 256)) == pytest.approx(2 * inverse)
    exp32 = price(aten.linalg_matrix_exp.default, meta(6144, 6144))
    assert exp32 >= 2 * (8 + 128) * 6144**3  # the squarings a float32 norm can need
    assert price(aten.linalg_matrix_exp.default, meta(64, 64, dtype=torch.float64)) > price(
        aten.linalg_matrix_exp.default, meta(64, 64)
    )


def test_a_matrix_power_is_priced_by_its_log2_k_matmuls() -> None:
    n = 512
    cost = price(aten.matrix_power.default, meta(n, n), 8)
    assert 3 * 2 * n**3 <= cost <= 4 * 2 * n**3


def test_a_composite_op_is_priced_by_the_ops_it_decomposes_into() -> None:
    x, w, b = meta(256, 256), meta(512, 256), meta(512)
    assert price(aten.linear.default, x, w, b) == 2 * 256 * 256 * 512  # t (a view), addmm


def test_data_dependent_ops_are_priced_from_their_recorded_sizes_without_running() -> None:
    x = meta(1000, 4)
    with pytest.raises(NotImplementedError):  # nonzero has no meta kernel: sizes are data
        aten.nonzero.default(x)
    bound = meta(4000, 2, dtype=torch.int64)  # export's recorded upper bound
    assert node_cost("nz", aten.nonzero.default, (x,), {}, bound) == ELEMENT * (4000 + 8000)


def test_an_op_without_a_rule_is_refused_naming_the_node_and_the_op() -> None:
    with pytest.raises(UnpricedOpError, match=r"node weird calls aten\._foobar\.default"):
        node_cost("weird", aten._foobar.default, (meta(4),), {}, meta(4))
    assert cost_rule(aten._foreach_add.List) is None


def test_higher_order_ops_run_their_bodies_as_often_as_their_shapes_say() -> None:
    xs = meta(7, 16)
    assert HOP_RULES["scan"].cost("scan", (None, [meta(16)], [xs], []), [10.0]) == 70.0
    assert HOP_RULES["map_impl"].cost("map", (None, [xs], []), [10.0, 1.0]) == 77.0
    assert HOP_RULES["cond"].cost("cond", (None, None, None, [xs]), [10.0, 3.0]) == 10.0
    assert HOP_RULES["invoke_subgraph"].cost("sub", (None, "id", xs), [5.0]) == 5.0
    with pytest.raises(UnpricedOpError, match="node loop is a while_loop"):
        HOP_RULES["while_loop"].cost("loop", (), [1.0])
    assert op_costs.hop_rule(torch.ops.higher_order.cond) is HOP_RULES["cond"]


@pytest.mark.skipif(not torch.__version__.startswith("2.13"), reason="names checked on 2.13")
def test_every_rule_names_an_op_of_this_torch() -> None:
    """A misspelt name would price nothing (its op then refused): catch it here."""
    missing = [name for name in COST_RULES if op_costs._packet(name) is None]
    assert not missing


def test_costs_are_finite_for_empty_and_scalar_tensors() -> None:
    for cost in (
        price(aten.sort.default, meta(0)),
        price(aten.add.Tensor, meta(), meta()),
        price(aten.linalg_inv_ex.default, meta(0, 3, 3)),
    ):
        assert math.isfinite(cost) and cost >= 0
