"""Judging at further sizes: a size whose calls are slow gets the time its rounds need.

distilbert_dyn beside two busy processes: every candidate was timed at the example, but at
batch 64 (about a second a call) the whole-model budget fitted no round, so none counted as
measured and the original shipped, 0.90x of AOTInductor.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tuner.tuning.tuner import TuneOptions, tune_program


class TwoTowers(nn.Module):
    """Two linears on one input (a fuse_horizontal_linear site): a candidate to judge."""

    def __init__(self, width: int = 768) -> None:
        super().__init__()
        self.left, self.right = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.left(x)) + torch.relu(self.right(x))


def _tuned(tmp_path: Path, budget_s: float) -> dict[str, dict[str, object]]:
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=2, max=8192)
    program = torch.export.export(
        TwoTowers().eval(),
        (torch.randn(8, 768),),
        dynamic_shapes={"x": {0: batch}},
        strict=False,
    )
    options = TuneOptions(
        budget_s=budget_s,
        backends=["eager"],
        threads=1,
        sizes={"batch": [8, 2048]},
        whole_model_budget_s=0.12,  # one call at batch 2048 takes about that on one thread
        cache_path=tmp_path / "cache.json",
        workdir=tmp_path,
    )
    outcome = tune_program(program, options)
    judged = [f for f in outcome.config.candidates if f.per_size]
    assert judged, [f.name for f in outcome.config.candidates]
    return {f.name: {p.label: p for p in f.per_size} for f in judged}


@pytest.mark.serial
def test_a_slow_size_gets_the_time_its_rounds_need(tmp_path: Path) -> None:
    for name, sizes in _tuned(tmp_path, budget_s=30).items():
        big = sizes["batch=2048"]
        assert big.rounds >= 6, (name, big)  # an interval, not "no timed round fitted"
        assert big.verdict != "not measured", (name, big)


def _peer_judge(
    glances: dict[str, float],
    speedups: dict[str, float],
    no_round_first: str | None = None,
    open_together: str | None = None,
) -> tuple[Any, list[str]]:
    """A Judge whose builds, glances and comparisons are stand-ins: `glances` are each peer's
    best of 2 calls (s), `speedups` what timing them together measures (interval +-2%);
    `no_round_first`: that peer's first comparison of its own fits no round; `open_together`:
    that peer's rounds with the others are too few for an interval. `order` lists what was
    timed: the peers timed together as one entry, then each measured at every size."""
    from types import SimpleNamespace

    from tuner.contract.config import Figures, Verdict
    from tuner.tuning.judge import NO_ROUND, Judge

    run = SimpleNamespace(
        model_time_s=1e-3,
        peer_notes=[],
        points=[],
        remaining=lambda: 30.0,
        options=SimpleNamespace(whole_model_budget_s=6.0),
    )
    judge = Judge(run, None, SimpleNamespace(check_s=lambda: 2.0))  # type: ignore[arg-type]
    order: list[str] = []

    def fields(name: str) -> dict[str, Any]:
        if name == no_round_first and order.count(name) == 1:
            return {"verdict": Verdict.NOT_MEASURED, "reason": NO_ROUND}
        s = speedups[name]
        return {"speedup": s, "ci": (0.98 * s, 1.02 * s), "verdict": Verdict.FASTER}

    def together(
        _captured: object, cands: list[Any], _budget_s: float
    ) -> tuple[list[dict[str, Any]], None]:
        order.append("+".join(c.name for c in cands))
        open_ = {"speedup": 1.5, "ci": (None, None), "verdict": Verdict.WITHIN_NOISE}
        return [open_ if c.name == open_together else fields(c.name) for c in cands], None

    def measure(_captured: object, cand: Any, fig: dict[str, Any], looked: object) -> Figures:
        order.append(cand.name)
        got = looked if isinstance(looked, dict) else fields(cand.name)
        return Figures(**fig, **got)

    judge._build = lambda cand: dict(name=cand.name, backend=cand.backend, passes=[])  # type: ignore[method-assign]
    judge._look = lambda gm, inputs, cand, base_s: glances[cand.name]  # type: ignore[method-assign]
    judge._together = together  # type: ignore[method-assign]
    judge._joint = lambda _captured, glanced: ([c for c, _ in glanced], 8.0)  # type: ignore[method-assign]
    judge._measure = measure  # type: ignore[method-assign]
    return judge, order


def _peers(*names: str) -> list[Any]:
    from types import SimpleNamespace

    return [SimpleNamespace(name=n, backend=n, passes=[], settings=None) for n in names]


def test_peers_are_built_then_timed_together_and_a_clearly_outrun_one_is_not_timed() -> None:
    """The dynamic recommendation model at 60 s: the runtimes' builds came first and their
    comparisons at three sizes left AOTInductor, twice as fast, 2 s short of fitting. The peers
    are timed together, fastest glance first; one glanced at over 3x the fastest is not."""
    from types import SimpleNamespace

    from tuner.tuning.judge import QUICK_DOUBT

    names = ["openvino", "onnxruntime", "inductor"]
    glances = {"openvino": 1.6e-3, "onnxruntime": 0.7e-3, "inductor": 0.5e-3}
    judge, order = _peer_judge(glances, {"inductor": 2.0, "onnxruntime": 1.2, "openvino": 0.8})
    captured = SimpleNamespace(gm=None, inputs=())
    figures, _ = judge.peers(captured, _peers(*names), lambda f, m: None, (0.0, 1.0))
    assert order == ["inductor+onnxruntime", "inductor", "onnxruntime"]
    assert [f.name for f in figures] == names  # reported in the peers' order
    assert [f.speedup for f in figures[1:]] == [1.2, 2.0]
    skipped = figures[0]
    assert skipped.verdict == "not measured" and skipped.reason.startswith("not timed: its best")
    assert f"3.20x as long as inductor's, more than the {QUICK_DOUBT:g}x" in skipped.reason
    assert judge.run.peer_notes[0] == (
        "best of 2 calls: inductor 0.5 ms, onnxruntime 0.7 ms, openvino 1.6 ms"
    )


def test_a_peer_whose_comparison_fitted_no_round_is_compared_again_where_time_is_left() -> None:
    """shufflenet_v2 at 60 s: ONNX Runtime's comparison fitted no round in its 6 s, it was
    never compared again, and OpenVINO shipped at 0.96x of it. Once the peers are timed, such
    a peer is compared once more on its own where a whole comparison and a check fit."""
    from types import SimpleNamespace

    from tuner.tuning.judge import NO_ROUND

    glances = {"openvino": 3.16e-3, "onnxruntime": 3.29e-3}
    speedups = {"openvino": 3.8, "onnxruntime": 4.1}
    captured = SimpleNamespace(gm=None, inputs=())

    def judged(left: float) -> tuple[list[Any], list[str]]:
        judge, order = _peer_judge(
            glances, speedups, no_round_first="onnxruntime", open_together="onnxruntime"
        )
        judge.run.remaining = lambda: left
        peers = _peers("openvino", "onnxruntime")
        return judge.peers(captured, peers, lambda f, m: None, (0, 1))[0], order

    figures, order = judged(30.0)
    assert order == ["openvino+onnxruntime", "openvino", "onnxruntime", "onnxruntime"]
    assert figures[1].verdict == "faster" and figures[1].speedup == 4.1
    figures, order = judged(7.9)  # a comparison (6 s) and a check (2 s) do not fit
    assert order == ["openvino+onnxruntime", "openvino", "onnxruntime"]
    assert figures[1].reason == NO_ROUND


def test_a_peer_whose_rounds_together_gave_no_interval_is_compared_on_its_own() -> None:
    """Rounds of several peers together can fall short of an interval (efficientnet_b0 at 60 s:
    5 rounds of four variants in 8 s, and the original shipped at 0.39x of ONNX Runtime).
    Such a peer is compared on its own, as where the rounds did not fit at all."""
    from types import SimpleNamespace

    glances = {"openvino": 7.7e-3, "onnxruntime": 7.0e-3}
    speedups = {"openvino": 2.5, "onnxruntime": 2.7}
    judge, order = _peer_judge(glances, speedups, open_together="openvino")
    captured = SimpleNamespace(gm=None, inputs=())
    figures, _ = judge.peers(captured, _peers("openvino", "onnxruntime"), lambda f, m: None, (0, 1))
    assert order == ["onnxruntime+openvino", "onnxruntime", "openvino"]
    assert figures[0].verdict == "faster" and figures[0].speedup == 2.5
    assert judge.run.peer_notes[-1] == (
        "timed together with the original: onnxruntime, openvino; openvino on its own after them"
    )


def _sized_judge(left: float) -> Any:
    """A Judge at three sizes whose original's calls there are known (no calls made), with
    `left` seconds of the budget left."""
    from types import SimpleNamespace

    from tuner.graph.sizes import SizePoint
    from tuner.tuning.budget import Budget
    from tuner.tuning.judge import Judge

    run = SimpleNamespace(
        model_time_s=0.03,
        remaining=lambda: left,
        timing_budget=lambda: 6.0,
        options=SimpleNamespace(whole_model_budget_s=6.0),
        device=SimpleNamespace(kind="cpu"),
        points=[SizePoint(label, {}, ()) for label in ("batch=4", "batch=2", "batch=64")],
        size_time_s={"batch=2": 0.02, "batch=64": 0.5},
    )
    return Judge(run, None, Budget(run, None))  # type: ignore[arg-type]


def test_a_further_size_is_measured_where_its_least_check_and_rounds_fit() -> None:
    """distilbert_dyn at 60 s beside two busy processes: at batch 2 "checking and timing need
    about 5 s and 5 s are left" (the whole-model budget, cut to what was left, and the check
    on top); a comparison there needs 2 s for an interval."""
    from tuner.contract.config import SizeFigures
    from tuner.tuning.budget import MIN_TIMING_S

    judge = _sized_judge(left=5.0)
    faster = [SizeFigures(label="batch=4", sizes={}, verdict="faster")]
    batch2, batch64 = judge.run.points[1:]
    assert judge._unmeasured(lambda: None, batch2, faster) is None
    least = judge.budget.least_timing_s
    assert judge.budget.timing_s(lambda: None, 1) == pytest.approx(least(0.02))
    assert least(0.02) >= MIN_TIMING_S
    far = judge._unmeasured(lambda: None, batch64, faster)
    assert far["verdict"] == "not measured"
    assert (
        far["reason"]
        == "checking and timing at batch=64 need about 24 s and 5 s of the time budget are left"
    )


def test_the_further_sizes_are_kept_for_a_candidate_faster_at_the_example() -> None:
    """Every pass in eager, within noise at batch 4, took 20 s at batch 2 and 64, and OpenVINO,
    1.21x at batch 4, found none left there: where what is left cannot give the further sizes
    to two candidates, one not faster at the example's size does not get them."""
    from tuner.contract.config import SizeFigures

    noise = [SizeFigures(label="batch=4", sizes={}, verdict="within noise")]
    faster = [SizeFigures(label="batch=4", sizes={}, verdict="faster")]
    tight = _sized_judge(left=40.0)  # the further sizes need about 28 s, twice 56
    batch2 = tight.run.points[1]
    kept = tight._unmeasured(lambda: None, batch2, noise)
    assert kept["verdict"] == "not measured"
    assert kept["reason"] == (
        "within noise at batch=4: the 40 s left are kept for a candidate faster there"
    )
    assert tight._unmeasured(lambda: None, batch2, faster) is None
    assert _sized_judge(left=60.0)._unmeasured(lambda: None, batch2, noise) is None
    assert _sized_judge(left=1.0)._unmeasured(lambda: None, batch2, faster)["reason"] == (
        "time budget spent"
    )


def test_each_size_is_timed_with_what_the_sizes_after_it_leave() -> None:
    """distilbert_dyn at 60 s beside two busy processes: OpenVINO's comparisons at batch 4 and 2
    took the whole-model budget each, and batch 64 was left 3 s short."""
    from types import SimpleNamespace

    from tuner.tuning.budget import MIN_TIMING_S, NEW_SET_CALLS, UNKNOWN_SETS

    judge = _sized_judge(left=30.0)
    budget, least = judge.budget, judge.budget.least_timing_s
    checks = UNKNOWN_SETS * NEW_SET_CALLS  # calls per check (no inputs to count the sets on)
    at64 = least(0.5) + checks * 0.5
    assert budget.timing_s(lambda: None, 2) == pytest.approx(least(0.5))  # slow: its rounds
    assert budget.timing_s(lambda: None, 1) == pytest.approx(30.0 - checks * 0.02 - at64)
    assert budget.timing_s(lambda: None, 0) == pytest.approx(least(0.03))  # the least
    roomy = _sized_judge(left=100.0).budget
    assert roomy.timing_s(lambda: None, 0) == roomy.timing_s(lambda: None, 1) == 6.0
    judge.run.points = judge.run.points[:1]
    assert budget.timing_s(lambda: None, 0) is None  # one size: the whole-model budget
    judge.run.device = SimpleNamespace(kind="cuda")  # no runtime, no pauses between blocks
    assert budget.least_timing_s(0.0) == MIN_TIMING_S


def test_peers_are_timed_together_only_as_many_as_fit_their_rounds() -> None:
    """efficientnet_b0 at 60 s: its three peers and the original timed together in 8 s fitted
    5 rounds (a round: ten calls of each, a lead-in and a pause), too few for an interval, and
    the original shipped at 0.39x of ONNX Runtime. The slowest glances drop out of the joint
    timing until its rounds fit; with fewer than two left, each is compared on its own."""
    from types import SimpleNamespace

    from tuner.measure.timing import POOLED
    from tuner.tuning.budget import Budget
    from tuner.tuning.judge import Judge

    original, glances = 0.020, [0.00703, 0.00774, 0.0141]  # s a call, onnxruntime first
    budget = Budget(SimpleNamespace(), None)  # type: ignore[arg-type]
    assert not budget.together_fits([original, *glances], POOLED, 8.0)
    assert budget.together_fits([original, *glances[:2]], POOLED, 8.0)
    # resnet18 at 60 s: 25 ms calls, three peers glanced at 17-24 ms, 12 s. A round's calls are
    # capped as `run_rounds` caps them (a sixteenth of the budget), not ten of each.
    assert budget.together_fits([0.025, 0.0172, 0.0182, 0.0244], POOLED, 12.0)

    def joint(budget_s: float) -> list[str]:
        run = SimpleNamespace(model_time_s=original)
        stand_in = SimpleNamespace(
            together_s=lambda _b, _n: budget_s, together_fits=budget.together_fits
        )
        judge = Judge(run, SimpleNamespace(baseline=lambda gm: gm), stand_in)  # type: ignore[arg-type]
        peers = _peers("onnxruntime", "openvino", "inductor")
        got, got_s = judge._joint(SimpleNamespace(gm=None), list(zip(peers, glances, strict=True)))
        assert got_s == (budget_s if got else 0.0)  # the time its rounds are then given
        return [c.name for c in got]

    assert joint(12.0) == ["onnxruntime", "openvino", "inductor"]
    assert joint(8.0) == ["onnxruntime", "openvino"]
    assert joint(4.0) == []


@pytest.mark.parametrize(("packs_per_call", "packs"), [(True, 3), (False, 1)])
def test_timed_calls_pack_as_what_ships_is_run(packs_per_call: bool, packs: int) -> None:
    """At inference `load_tuned` packs on every call, so the timing does too (on the
    recommendation example the packing was 8% of a call); a training loop packs once."""
    from types import SimpleNamespace

    from tuner.tuning.judge import Judge

    seen: list[tuple[Any, ...]] = []

    def pack(inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        seen.append(inputs)
        return (sum(inputs),)

    kind = SimpleNamespace(site_run=SimpleNamespace(packs_per_call=packs_per_call))
    judge = Judge(SimpleNamespace(), kind, None)  # type: ignore[arg-type]
    cand = SimpleNamespace(transformed=SimpleNamespace(pack=pack))
    feed = judge._feed(cand, (1, 2))  # type: ignore[arg-type]
    assert [feed() for _ in range(3)] == [(3,)] * 3
    assert len(seen) == packs


def test_inference_packs_per_call_and_training_once() -> None:
    from tuner.tuning.inference import InferenceStep
    from tuner.tuning.train import TrainingStep

    assert InferenceStep.site_run.packs_per_call
    assert not TrainingStep.site_run.packs_per_call
