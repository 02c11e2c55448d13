"""Whole-model candidates are timed by promise: the backend's gain times the passes' gain."""

from __future__ import annotations

from typing import Any

from tuner.backends.inductor_settings import BEST_GAIN
from tuner.contract.config import Figures, PassStep, Verdict
from tuner.tuning.candidates import Candidate, identity
from tuner.tuning.promise import SLACK, by_promise, measured, with_settings

EVERY = [PassStep(pass_name="fuse_horizontal_embedding_bag", sites=["a", "b"])]
TUNED = [PassStep(pass_name="remove_dropout", sites=["c"])]


def cand(backend: str, passes: list[PassStep]) -> Candidate:
    return Candidate(f"{backend} {len(passes)}", backend, passes, transformed=None)  # type: ignore[arg-type]


def fig(c: Candidate, speedup: float | None, **kw: Any) -> Figures:
    verdict = kw.pop("verdict", Verdict.FASTER if speedup else Verdict.NOT_MEASURED)
    return Figures(
        name=c.name, backend=c.backend, passes=c.passes, speedup=speedup, verdict=verdict, **kw
    )


def test_the_recommendation_models_winner_goes_first_and_the_hopeless_are_not_timed() -> None:
    """As on the seeds' recommendation model at 120 s: ONNX Runtime at 0.06x had its pass
    variants timed while AOTInductor with every pass (the 4x winner) ran out of budget."""
    peers = {b: cand(b, []) for b in ("inductor", "openvino", "onnxruntime", "compile")}
    eager = [cand("eager", TUNED), cand("eager", EVERY)]
    seen = [*peers.values(), *eager]
    speeds = [1.73, 1.04, 0.06, None, 1.89, 1.98]
    got = measured(seen, [fig(c, s) for c, s in zip(seen, speeds, strict=True)])
    rest = [
        cand(b, p)
        for b in ("openvino", "onnxruntime", "inductor", "compile")
        for p in (TUNED, EVERY)
    ]
    timed, hopeless = by_promise(rest, got)
    assert [(c.backend, c.passes is EVERY) for c in timed] == [
        ("inductor", True),  # 1.73 * 1.98
        ("inductor", False),
        ("openvino", True),
        ("openvino", False),
        ("compile", False),  # torch.compile alone was not measured: no prediction, last
        ("compile", True),
    ]
    assert [c.backend for c, _ in hopeless] == ["onnxruntime", "onnxruntime"]
    reason = hopeless[1][1].reason or ""
    assert (
        hopeless[1][1].verdict == Verdict.NOT_MEASURED and "0.06x" in reason and "1.98x" in reason
    )


def test_the_line_is_slack_times_the_prediction_against_the_best() -> None:
    """Every pass in eager at 2x is the best; OpenVINO with every pass is predicted at
    2x its gain alone, so it is timed while SLACK times that reaches 2x."""
    for alone, timed_expected in ((1.02 / SLACK, True), (0.98 / SLACK, False)):
        seen = [cand("openvino", []), cand("eager", EVERY)]
        got = measured(seen, [fig(seen[0], alone), fig(seen[1], 2.0)])
        timed, hopeless = by_promise([cand("openvino", EVERY)], got)
        assert (len(timed), len(hopeless)) == ((1, 0) if timed_expected else (0, 1))


def test_wrong_or_unmeasured_figures_predict_nothing() -> None:
    c = [cand("inductor", []), cand("eager", EVERY)]
    wrong = fig(c[0], 3.0, verdict=Verdict.WRONG_OUTPUTS)
    got = measured(c, [wrong, fig(c[1], 2.0)])
    assert got == {("eager", (("fuse_horizontal_embedding_bag", ("a", "b")),)): 2.0}
    timed, hopeless = by_promise([cand("inductor", EVERY)], got)
    assert len(timed) == 1 and not hopeless


def test_inductors_settings_go_on_its_fastest_candidate_where_they_can_win() -> None:
    alone, every = cand("inductor", []), cand("inductor", EVERY)
    ov = cand("openvino", [])
    seen = [alone, every, ov]
    tried, hopeless = with_settings(seen, [fig(alone, 1.7), fig(every, 3.7), fig(ov, 1.0)], "cpu")
    assert [c.settings for c in tried] == ["max-autotune", "freezing", "concat-linear"]
    assert all(c.passes is EVERY and c.backend == "inductor" for c in tried)
    assert tried[0].name == "inductor 1 [max-autotune]" and not hopeless
    # the settings make a key of their own: their compile times and predictions stay apart
    assert identity(tried[0])[0] == "inductor@max-autotune" != identity(every)[0]


def test_settings_are_not_built_where_even_their_best_gain_stays_below_the_best() -> None:
    every, ov = cand("inductor", EVERY), cand("openvino", EVERY)
    for inductor_speed, built in ((2.0 / BEST_GAIN * 1.01, True), (2.0 / BEST_GAIN * 0.99, False)):
        tried, hopeless = with_settings(
            [every, ov], [fig(every, inductor_speed), fig(ov, 2.0)], "cpu"
        )
        assert bool(tried) is built and bool(hopeless) is not built
    reason = hopeless[0][1].reason or ""
    assert hopeless[0][1].settings == "max-autotune" and "2.00x" in reason
    # nothing under inductor measured, or a device without settings: nothing offered
    assert with_settings([ov], [fig(ov, 2.0)], "cpu") == ([], [])
    assert with_settings([every], [fig(every, 3.0)], "cuda") == ([], [])
    wrong = fig(every, 3.0, verdict=Verdict.WRONG_OUTPUTS)
    assert with_settings([every], [wrong], "cpu") == ([], [])


def test_near_ties_go_to_the_candidate_that_rewrites_more() -> None:
    """As on the recommendation model: the tuned passes (3 sites) and every pass (4) both about
    2x in eager, so AOTInductor with every pass goes first; a clear lead still decides."""
    three = [PassStep(pass_name="fuse_horizontal_linear", sites=["a", "b", "c"])]
    four = [PassStep(pass_name="fuse_horizontal_linear", sites=["a", "b", "c", "d"])]
    for eager_tuned, first in ((2.03, four), (2.30, three)):
        seen = [cand("inductor", []), cand("eager", three), cand("eager", four)]
        got = measured(seen, [fig(seen[0], 2.0), fig(seen[1], eager_tuned), fig(seen[2], 1.99)])
        timed, _ = by_promise([cand("inductor", three), cand("inductor", four)], got)
        assert timed[0].passes is first, eager_tuned
