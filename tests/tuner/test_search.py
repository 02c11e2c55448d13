"""The site search keeps only what measurement and output checks support."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from tests.tuner.tuning_fixtures import ReluNet, SlowRelu, WrongRelu, registered
from tuner.cache import DecisionCache
from tuner.capture import export_module, to_graph_module
from tuner.search import SearchResult, SearchSettings, SiteSearch


def _search(passes: list[str], cache: DecisionCache | None = None) -> SearchResult:
    inputs = (torch.randn(256, 64),)
    gm = to_graph_module(export_module(ReluNet().eval(), inputs))
    settings = SearchSettings(passes=passes, site_budget_s=1.0, hardware_key="test")
    return SiteSearch(settings, cache or DecisionCache(None)).run(copy.deepcopy(gm), inputs)


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
        first = _search(["test_slow_relu"], DecisionCache(cache_file))
        second_cache = DecisionCache(cache_file)
        second = _search(["test_slow_relu"], second_cache)
    assert first.timed == 1 and second.timed == 0
    assert second_cache.hits == 1
    assert second.decisions[0].cached
    assert second.decisions[0].verdict == first.decisions[0].verdict
    assert second.decisions[0].speedup == first.decisions[0].speedup
