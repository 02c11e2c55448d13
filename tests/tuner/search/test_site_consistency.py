"""A site timed slower than the whole model containing it is re-measured, then not trusted."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.passes_helpers import Ranker, ranker_inputs
from tests.tuner.tuning_fixtures import SplitNormTanh
from tuner.graph.capture import export_module, to_graph_module
from tuner.graph.sizes import SizePoint
from tuner.measure import timing as measure
from tuner.measure.timing import quick_per_call_s
from tuner.measure.verdicts import Comparison
from tuner.search.decisions import DecisionCache, MemoryDecisionCache
from tuner.search.site_search import SearchSettings, SiteSearch


def _stalled(c: Comparison, factor: float) -> Comparison:
    """The comparison as if the baseline's thread had stalled in every round (a 27.9 ms site
    inside a 3.28 ms model, as a dashboard run showed)."""
    base = [b * factor for b in c.baseline_s]
    return Comparison.from_samples(base, c.candidate_s, c.stopped, confidence=c.confidence)


def _stall(monkeypatch: pytest.MonkeyPatch, stalls: int) -> list[int]:
    """The first `stalls` site timings inflated 1000x; the list holds the number of calls."""
    calls = [0]
    real = measure.compare

    def compare(*args: Any, **kwargs: Any) -> Comparison:
        calls[0] += 1
        c = real(*args, **{**kwargs, "budget_s": 2.0})
        return _stalled(c, 1000.0) if calls[0] <= stalls else c

    monkeypatch.setattr("tuner.search.site_search.compare", compare)
    return calls


def _search(
    monkeypatch: pytest.MonkeyPatch, stalls: int, sized: bool = False
) -> tuple[list[Any], int, DecisionCache]:
    """Search with the first `stalls` site timings inflated 1000x; returns decisions, calls.
    `sized`: the search reports per size (one: the example's, as a dynamic program's would)."""
    calls = _stall(monkeypatch, stalls)
    module = SplitNormTanh(n=4).eval()
    x = torch.randn(8, 64)
    gm = to_graph_module(export_module(module, (x,)))
    # The model's time with room for a loaded machine: only the stalls (1000x) contradict it.
    model_s = 5 * quick_per_call_s(lambda: gm(x))
    points = [SizePoint("batch=8", {"batch": 8}, (x,))] if sized else []
    settings = SearchSettings(
        passes=["fuse_horizontal_layernorm"], model_time_s=model_s, points=points
    )
    cache = MemoryDecisionCache()
    result = SiteSearch(settings, cache).run(copy.deepcopy(gm), (x,))
    return result.decisions, calls[0], cache


@pytest.mark.serial
def test_a_site_slower_than_its_model_twice_is_not_trusted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decisions, calls, cache = _search(monkeypatch, stalls=10)
    (d,) = decisions
    assert calls == 2  # measured, contradicted the model, measured again
    assert not d.accepted and d.verdict == "not measured"
    assert d.inconsistent is not None and "> model" in d.inconsistent
    assert "inconsistent: site baseline" in (d.reason or "")
    assert "not trusted" in (d.reason or "")
    assert not cache.records()  # re-measured next run, not remembered


@pytest.mark.serial
def test_an_untrusted_site_still_reports_its_figures_at_the_example_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was timed: like every timed site, its figures per size start at the example's."""
    decisions, _, _ = _search(monkeypatch, stalls=10, sized=True)
    (d,) = decisions
    assert d.verdict == "not measured" and d.inconsistent is not None and d.rounds
    assert [(f.label, f.verdict, f.rounds) for f in d.per_size] == [
        ("batch=8", "not measured", d.rounds)
    ]


@pytest.mark.serial
def test_a_site_consistent_when_re_measured_keeps_the_second_verdict(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decisions, calls, _ = _search(monkeypatch, stalls=1)
    (d,) = decisions
    assert calls == 2
    assert d.inconsistent is None
    assert d.verdict != "not measured"
    assert d.baseline_s is not None and d.baseline_s < 1.0


def test_a_pass_timed_on_the_whole_program_is_not_checked_against_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """combine_sparse_inputs changes the inputs, so its "site" is the whole program: a second
    measurement of the model is not a part that could contradict the first."""
    calls = _stall(monkeypatch, stalls=10)
    rows = [10, 7, 12]
    make = ranker_inputs(rows, [5, 8, 3], bags=4)
    inputs = make(torch.Generator().manual_seed(0))
    gm = to_graph_module(export_module(Ranker(rows).eval(), inputs))
    model_s = quick_per_call_s(lambda: gm(*inputs))
    settings = SearchSettings(passes=["combine_sparse_inputs"], model_time_s=model_s)
    (d,) = SiteSearch(settings, MemoryDecisionCache()).run(copy.deepcopy(gm), inputs).decisions
    assert calls == [1]
    assert d.inconsistent is None and d.verdict != "not measured"
