"""Issue 47's programs whose cost per call the bounds let through, refused before anything runs;
and the bodies of higher-order ops counted as often as their shapes say they run."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from fxtune_cli import app
from tests.cost_bombs import cost_bombs
from tests.crafted import strings_program_file
from tuner.contract.errors import UnsafeArtifactError
from tuner.contract.exit_codes import ExitCode
from tuner.graph.capture import export_module, to_graph_module
from tuner.loading.bounds import (
    DEFAULT_MAX_FLOPS,
    Bounds,
    ResourceBoundError,
    check_bounds,
    footprint,
    load_bounded,
)
from tuner.loading.load import load_program
from tuner.loading.op_costs import ELEMENT, UnpricedOpError

# Memory limits out of the way: these tests are about cost.
ROOMY = Bounds(max_tensor_bytes=2**50, max_live_bytes=2**50, max_flops=DEFAULT_MAX_FLOPS)


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return cost_bombs(tmp_path_factory.mktemp("cost_bombs"))


def test_a_while_loop_whose_trip_count_is_data_is_refused_at_load(bombs: dict[str, Path]) -> None:
    with pytest.raises(UnpricedOpError, match="node while_loop is a while_loop: its trip count"):
        load_bounded(bombs["while_loop"])


def test_an_uncounted_matrix_exponential_is_counted_so_a_10s_budget_refuses_it(
    bombs: dict[str, Path],
) -> None:
    program = load_program(bombs["matrix_exp"])
    (needs,) = check_bounds(program, ROOMY)
    assert needs.flops >= 2 * 136 * 6144**3  # the Pade products and a float32's squarings
    with pytest.raises(ResourceBoundError, match=r"node linalg_matrix_exp .* FLOPs"):
        load_bounded(bombs["matrix_exp"], budget_s=10.0)


def test_chained_sorts_are_refused_under_the_default_limit(bombs: dict[str, Path]) -> None:
    started = time.perf_counter()
    with pytest.raises(ResourceBoundError, match=r"node sort_\d+ one call needs .* FLOPs"):
        check_bounds(load_program(bombs["sort_chain"]), ROOMY)
    assert time.perf_counter() - started < 10


def test_the_power_tower_is_refused_in_milliseconds(bombs: dict[str, Path]) -> None:
    started = time.perf_counter()
    with pytest.raises(UnsafeArtifactError, match="bits"):
        load_program(bombs["power_tower"])
    assert time.perf_counter() - started < 1  # reading the archive included


@pytest.mark.parametrize("name", ["while_loop", "sort_chain", "power_tower"])
def test_fxtune_sites_exits_3_naming_why(bombs: dict[str, Path], name: str) -> None:
    result = CliRunner().invoke(app, ["sites", str(bombs[name])])
    assert result.exit_code == ExitCode.REFUSED, result.output
    assert "refused" in result.output


class _Foobar(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._foobar(x) * 2


def test_an_op_without_a_cost_rule_is_refused_naming_the_node_and_op() -> None:
    """`aten._foobar` (torch's test op): accepted by the op policy, priced by nothing."""
    program = export_module(_Foobar(), (torch.randn(4),))
    with pytest.raises(UnpricedOpError, match=r"node _foobar calls aten\._foobar\.default"):
        check_bounds(program, ROOMY)


class _Branches(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x.sort().values, lambda x: x * 2, (x,))


class _Scan(nn.Module):
    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops.scan import scan

        def step(carry: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return carry + x.sort().values, carry * 2

        return scan(step, torch.zeros(xs.shape[1:]), xs)[1]


def _body_costs(gm: torch.fx.GraphModule) -> list[float]:
    return [
        footprint(body, {}, ROOMY).flops
        for body in gm.children()
        if isinstance(body, torch.fx.GraphModule)
    ]


def test_a_cond_costs_its_dearer_branch() -> None:
    x = torch.randn(64, 64)
    gm = to_graph_module(export_module(_Branches(), (x,)))
    (needs,) = check_bounds(export_module(_Branches(), (x,)), ROOMY)
    dearer = max(_body_costs(gm))
    predicate = ELEMENT * (x.numel() + 1) + ELEMENT * 2  # sum, then > 0
    assert needs.flops == pytest.approx(dearer + predicate)


@pytest.mark.parametrize("steps", [3, 12])
def test_a_scan_costs_its_body_once_per_slice(steps: int) -> None:
    xs = torch.randn(steps, 256)
    program = export_module(_Scan(), (xs,))
    (body,) = _body_costs(to_graph_module(program))
    (needs,) = check_bounds(program, ROOMY)
    init = ELEMENT * 256  # zeros
    assert needs.flops == pytest.approx(init + steps * body)


def test_programs_of_uncommon_ops_still_pass(tmp_path: Path) -> None:
    """quantile (a sort), an FFT, searchsorted, inv_ex, scatter_reduce, item, asserts: priced."""
    program = load_program(strings_program_file(tmp_path / "strings.pt2"))
    (needs,) = check_bounds(program, ROOMY)
    assert 0 < needs.flops < 1e8
