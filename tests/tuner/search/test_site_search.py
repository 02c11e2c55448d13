"""The site search keeps only what measurement and output checks support."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.tuner.tuning_fixtures import ReluNet, SlowRelu, WrongRelu, registered
from tuner.graph.capture import export_module, to_graph_module
from tuner.search.decisions import DecisionCache, JsonDecisionCache, MemoryDecisionCache
from tuner.search.site_search import SearchResult, SearchSettings, SiteSearch


def _search(passes: list[str], cache: DecisionCache | None = None) -> SearchResult:
    inputs = (torch.randn(256, 64),)
    gm = to_graph_module(export_module(ReluNet().eval(), inputs))
    settings = SearchSettings(passes=passes, site_budget_s=1.0, hardware_key="test")
    return SiteSearch(settings, cache or MemoryDecisionCache()).run(copy.deepcopy(gm), inputs)


def test_slow_rewrite_is_rejected_by_measurement() -> None:
    with registered(SlowRelu):
        result = _search(["test_slow_relu"])
    (decision,) = result.decisions
    assert decision.verdict == "slower"
    assert not decision.accepted
    assert decision.ci is not None and decision.ci[1] < 1.0
    assert result.steps == []
    assert result.timed == 1
    samples = result.samples[f"test_slow_relu:{decision.site_id}"]
    assert len(samples["baseline_s"]) == decision.rounds > 0


def test_wrong_rewrite_is_rejected_before_timing() -> None:
    with registered(WrongRelu):
        result = _search(["test_wrong_relu"])
    (decision,) = result.decisions
    assert decision.verdict == "wrong outputs"
    assert decision.reason
    assert result.timed == 0
    assert result.samples == {}
    assert "sigmoid" not in str(result.gm.graph)


def test_cached_decisions_are_reused(tmp_path: Path) -> None:
    cache_file = tmp_path / "cache.json"
    with registered(SlowRelu):
        first = _search(["test_slow_relu"], JsonDecisionCache(cache_file))
        second_cache = JsonDecisionCache(cache_file)
        second = _search(["test_slow_relu"], second_cache)
    assert first.timed == 1 and second.timed == 0
    assert second_cache.hits == 1
    assert second.decisions[0].cached
    assert second.decisions[0].verdict == first.decisions[0].verdict
    assert second.decisions[0].speedup == first.decisions[0].speedup


class TinyReluThenWide(nn.Module):
    """A relu on 16 values beside a 8 GFLOP matmul: the relu is far below any noise share.

    (An op right after a multi-threaded matmul pays tens of microseconds of the thread pool's
    wind-down, which the profile rightly charges to it: the matmul is large enough for that.)"""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.Linear(2048, 4096)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        small = torch.relu(y)
        return self.wide(x), small


class TwoRelus(nn.Module):
    """Two relu sites of different sizes, the small one first in the graph."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(x), torch.relu(y)


def _profiled_search(module: nn.Module, inputs: tuple) -> SearchResult:
    gm = to_graph_module(export_module(module.eval(), inputs))
    settings = SearchSettings(
        passes=["test_slow_relu"], site_budget_s=0.5, hardware_key="test", noise_share=0.005
    )
    return SiteSearch(settings, MemoryDecisionCache()).run(copy.deepcopy(gm), inputs)


def test_a_site_below_the_noise_share_is_reported_not_timed() -> None:
    with registered(SlowRelu):
        result = _profiled_search(TinyReluThenWide(), (torch.randn(512, 2048), torch.randn(16)))
    (decision,) = result.decisions
    assert decision.verdict == "not measured" and not decision.accepted
    assert decision.share is not None and decision.share < 0.005
    assert "below noise" in (decision.reason or "") and "not timed" in (decision.reason or "")
    assert result.timed == 0
    assert result.counts()["below_noise"] == 1


@pytest.mark.serial
def test_sites_are_measured_in_order_of_the_time_they_cover() -> None:
    with registered(SlowRelu):
        result = _profiled_search(TwoRelus(), (torch.randn(64), torch.randn(512, 1024)))
    shares = [d.share for d in result.decisions]
    assert len(shares) == 2 and all(s is not None for s in shares), shares
    assert shares[0] > shares[1], shares  # the large relu first, though it comes second
    assert all(d.rounds > 0 for d in result.decisions)  # both timed, the larger first


@pytest.mark.parametrize(("packs_per_call", "packs"), [(True, 3), (False, 1)])
def test_a_repacking_site_is_timed_packing_as_it_ships(packs_per_call: bool, packs: int) -> None:
    """A forward site that repacks the inputs pays the packing on every timed call, as
    `load_tuned` runs it; a training step's inputs are packed once, outside the step."""
    from dataclasses import replace

    from tuner.search.site_search import FORWARD, FORWARD_BACKWARD, _Pair

    seen: list[tuple[int, ...]] = []

    def pack(inputs: tuple[int, ...]) -> tuple[int, ...]:
        seen.append(inputs)
        return (sum(inputs),)

    pair = _Pair(lambda *a: a, lambda *a: a, (1, 2), pack)  # type: ignore[arg-type]
    run = replace(FORWARD, packs_per_call=packs_per_call)
    call = pair.timed_candidate(run)
    assert [call() for _ in range(3)] == [(3,)] * 3
    assert len(seen) == packs
    assert FORWARD.packs_per_call and not FORWARD_BACKWARD.packs_per_call


def test_a_site_that_keeps_the_inputs_times_them_as_given() -> None:
    from tuner.search.site_search import FORWARD, _Pair

    pair = _Pair(lambda *a: a, lambda *a: a, (1, 2))  # type: ignore[arg-type]
    assert pair.timed_candidate(FORWARD)() == (1, 2)
