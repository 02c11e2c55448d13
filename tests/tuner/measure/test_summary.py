"""One timing summary for search, tune, configs and reports; intervals print with open ends."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fxtune_cli import app
from tests.tuner.tuning_fixtures import SplitNormTanh
from tuner.contract.config import SiteDecision, TunedConfig, Verdict
from tuner.graph.capture import export_module, save_program
from tuner.graph.sites import Site, make_site
from tuner.measure import timing as measure
from tuner.measure.summary import format_interval, summarize
from tuner.measure.verdicts import Comparison, timing_fields, verdict
from tuner.search.site_decision import site_decision


def _site() -> Site:
    gm = torch.fx.symbolic_trace(torch.nn.ReLU())
    return make_site("p", [n for n in gm.graph.nodes if n.op == "call_function"], "relu")


def _decision(c: Comparison) -> SiteDecision:
    site = _site()
    return site_decision(site.pass_name, site.id, site.summary, Verdict.FASTER, c)


def _comparison(base: list[float], cand: list[float]) -> Comparison:
    return Comparison(base, cand, 1.0, 0.0, math.inf, len(base), "budget")


def test_a_non_finite_sample_drops_its_whole_round_everywhere() -> None:
    base = [2.0] * 4 + [math.inf] * 5
    cand = [1.0] * 9
    c = _comparison(base, cand)
    s = summarize(base, cand)
    assert (s.rounds, s.dropped, s.baseline_s, s.speedup) == (4, 5, 2.0, 2.0)
    assert c.to_dict()["baseline_median_s"] == 2.0
    assert timing_fields(c)["baseline_s"] == 2.0
    assert _decision(c).baseline_s == 2.0  # was the upper median: inf


def test_medians_are_the_median_not_the_upper_one() -> None:
    c = _comparison([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0])
    assert _decision(c).baseline_s == 2.5


def test_too_few_rounds_leave_both_sides_open() -> None:
    s = summarize([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert s.ci == (None, None) and s.speedup == pytest.approx(2.0)
    assert timing_fields(_comparison([2.0] * 3, [1.0] * 3))["ci"] == (None, None)
    assert verdict(_comparison([2.0] * 3, [1.0] * 3)) == "within noise"


def test_format_interval_prints_open_ends() -> None:
    assert format_interval((0.981, 1.04)) == "[0.98, 1.04]"
    assert format_interval((0.98, None)) == "[0.98, open)"
    assert format_interval((None, 1.04)) == "(open, 1.04]"
    assert format_interval((None, None)) == "(open)"
    assert format_interval(None) == "-"


@pytest.mark.serial
def test_cli_prints_a_candidate_timed_in_too_few_rounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's crash: (0.0, None) was formatted with :.2f after the outputs were written."""
    real = measure.compare
    monkeypatch.setattr(
        "tuner.tuning.judge.compare", lambda *a, **k: real(*a, **{**k, "max_rounds": 3})
    )
    program = export_module(SplitNormTanh(n=8).eval(), (torch.randn(16, 128),))
    model = save_program(program, tmp_path / "m.pt2")
    out, report = tmp_path / "tuned.pt2", tmp_path / "report.json"
    args = ["tune", str(model), "--out", str(out), "--report", str(report), "--budget-s", "10"]
    args += ["--backend", "eager", "--no-profile", "--cache", str(tmp_path / "c.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config = TunedConfig.model_validate(json.loads(report.read_text())["config"])
    timed = [f for f in config.candidates if f.rounds]
    assert timed and all(f.ci == (None, None) for f in timed)
    assert "(open)" in result.output
