"""`budget_s` is a limit: compiles that will not fit are skipped, those that overrun stopped.

The promise: a tuning run (`fxtune tune`, outputs and profiles included) ends within
`budget_s + MARGIN_S`; the margin covers what runs after the budget is checked the last time
(verification, writing the program, profiling) and starting the command. It holds with other
work on the cores (the run samples the load as it starts and scales its compile estimates by
it), so these tests run beside the suite's other tests instead of alone (`serial`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from examples.build import build
from examples.models import recsys
from fxtune_cli import app
from tests.tuner.tuning_fixtures import (
    SplitNormTanh,
    WrongRelu,
    busy_cores,
    record_compile,
    registered,
)
from tuner.backends.compile_time import CompileTimes
from tuner.backends.isolation import CompileOverrun, compile_aoti_in_child
from tuner.graph.capture import export_module
from tuner.host.load import CoreLoad
from tuner.tuning.bucketing import DISPATCH_EXPORT, DispatchCost
from tuner.tuning.tuner import TuneOptions, tune_program

MARGIN_S = 15.0


def test_compile_times_estimate_from_what_was_measured(tmp_path: Path) -> None:
    times = CompileTimes.for_cache(tmp_path / "decisions.json")
    assert times.estimate("hw", "inductor", 100) is None
    times.record("hw", "inductor", nodes=100, seconds=20.0)
    times.record("hw", "inductor", nodes=400, seconds=30.0)
    again = CompileTimes.for_cache(tmp_path / "decisions.json")  # kept beside the cache
    assert again.estimate("hw", "inductor", 100) == pytest.approx(20.0)
    assert again.estimate("hw", "inductor", 1600) == pytest.approx(60.0)  # nearest: 400 nodes
    assert again.estimate("hw", "compile", 400) is None  # torch.compile keeps its own
    assert again.planning_estimate("hw", "compile", 400) == (pytest.approx(29.0), False)
    assert again.estimate("other hw", "inductor", 100) is None


def test_a_job_records_only_its_own_compiles_and_the_newest_of_a_size_plans(
    tmp_path: Path,
) -> None:
    """A job reads a snapshot of the store and writes what it measured for the caller to
    append: were the snapshot's records written again, every merge would copy them once more
    (a CLI run's store held each compile 2-4 times after three runs)."""
    store = tmp_path / "decisions.json"
    CompileTimes.for_cache(store).record("hw", "inductor", nodes=244, seconds=26.0)  # cold
    out = tmp_path / "out"
    out.mkdir()
    job = CompileTimes.for_cache(store, record_to=out)
    job.record("hw", "inductor", nodes=244, seconds=13.0)  # warm caches
    assert json.loads((out / "compile_times.json").read_text()) == {"hw::inductor": [[244, 13.0]]}
    assert job.estimate("hw", "inductor", 244) == pytest.approx(13.0)


def test_compile_times_are_kept_as_a_quiet_machine_would_take_them(tmp_path: Path) -> None:
    """Measured with other work on the cores (slowdown 2), a compile counts half for later runs,
    and a loaded run expects its compiles, the prior's too, to take twice as long."""
    loaded = CompileTimes.for_cache(tmp_path / "d.json", slowdown=2.0)
    loaded.record("hw", "inductor", nodes=100, seconds=40.0)
    quiet = CompileTimes.for_cache(tmp_path / "d.json")
    assert quiet.estimate("hw", "inductor", 100) == pytest.approx(20.0)
    assert loaded.estimate("hw", "inductor", 100) == pytest.approx(40.0)
    prior, measured = quiet.planning_estimate("other hw", "inductor", 100)
    assert not measured
    assert loaded.planning_estimate("other hw", "inductor", 100)[0] == pytest.approx(2 * prior)


def test_a_compile_in_a_child_is_scaled_by_the_child_s_slowdown(tmp_path: Path) -> None:
    """Beside other work, a child of its own session that got the whole of a core builds in
    its quiet time: its compiles are kept and expected as measured, while this process's
    compiles (torch.compile) still count half."""
    loaded = CompileTimes.for_cache(tmp_path / "d.json", 2.0, {"inductor": 1.0})
    loaded.record("hw", "inductor", nodes=100, seconds=20.0)
    loaded.record("hw", "compile", nodes=100, seconds=20.0)
    quiet = CompileTimes.for_cache(tmp_path / "d.json")
    assert quiet.estimate("hw", "inductor", 100) == pytest.approx(20.0)
    assert quiet.estimate("hw", "compile", 100) == pytest.approx(10.0)
    assert loaded.estimate("hw", "inductor", 100) == pytest.approx(20.0)
    assert loaded.estimate("hw", "compile", 100) == pytest.approx(20.0)


def test_a_dispatching_program_that_cannot_be_exported_in_what_is_left_is_not_started() -> None:
    times = CompileTimes(None, slowdown=2.0)
    times.record("hw", DISPATCH_EXPORT, nodes=300, seconds=12.0)  # 6 s on a quiet machine
    left = [20.0]
    cost = DispatchCost(times, "hw", lambda: left[0])
    assert cost.refusal(300) is None
    left[0] = 10.0
    assert cost.refusal(300) == (
        "exporting the dispatching program (300 nodes) is estimated at 12 s and 10 s of the "
        "time budget are left"
    )
    # Nothing measured on this hardware yet: the prior, scaled by the load, decides.
    prior, measured = times.planning_estimate("other hw", DISPATCH_EXPORT, 300)
    assert not measured and prior > 0


def test_the_budget_counts_from_when_the_caller_started(tmp_path: Path) -> None:
    """`fxtune tune` starts the clock before loading the program: a run told that 9 of its
    10 s went to loading starts nothing, and its report says what load it saw."""
    program = export_module(SplitNormTanh(n=4).eval(), (torch.randn(8, 64),))
    options = TuneOptions(
        budget_s=10, started=time.monotonic() - 9.0, backends=["eager"], cache_path=None
    )
    started = time.monotonic()
    outcome = tune_program(program, options)
    assert time.monotonic() - started < 5.0
    tuning = outcome.config.tuning
    assert tuning["seconds"] >= 9.0
    assert all(f.verdict == "not measured" for f in outcome.config.candidates)
    assert outcome.config.whole_model.name == "original"
    assert set(tuning["load"]) == {"cores", "busy", "child_share", "slowdown", "child_slowdown"}
    assert tuning["load"]["slowdown"] >= 1.0


@pytest.mark.serial
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_fxtune_tune_beside_busy_cores_tunes_on_the_cores_left_and_says_so(
    tmp_path: Path,
) -> None:
    """Every core busy with other work: `fxtune tune` (no --threads) tunes on one thread, so
    no kernel waits for a descheduled thread, and the report says what it saw."""
    program = export_module(SplitNormTanh(n=4).eval(), (torch.randn(8, 64),))
    torch.export.save(program, tmp_path / "m.pt2")
    out = tmp_path / "out"
    args = ["tune", str(tmp_path / "m.pt2"), "--out", str(out / "t.pt2")]
    # What is asserted is decided as the run starts (threads, load, notes): a short budget.
    args += ["--report", str(out / "r.json"), "--budget-s", "4", "--backend", "eager"]
    args += ["--cache", str(tmp_path / "c.json"), "--no-profile"]
    with busy_cores() as cores:
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "r.json").read_text())["config"]
    assert config["hardware"]["threads"] == 1
    assert config["tuning"]["load"]["busy"] >= 0.7 * cores
    notes = " ".join(config["tuning"]["peers"])
    assert f"cores busy with other work: tuning on 1 of {cores} threads" in notes, notes
    said = " ".join(result.output.split())  # and what to do where it deploys on every core
    assert f"measured on 1 of {cores} threads" in said and f"--threads {cores}" in said, said


def test_an_overrunning_child_compile_is_stopped(tmp_path: Path) -> None:
    example = recsys()
    program = export_module(example.module, example.example_inputs)
    torch.export.save(program, tmp_path / "p.pt2")
    started = time.monotonic()
    with pytest.raises(CompileOverrun, match="did not finish"):
        compile_aoti_in_child(tmp_path / "p.pt2", tmp_path / "p.aoti.pt2", timeout_s=2.0)
    assert time.monotonic() - started < 6.0


def test_a_compile_estimated_not_to_fit_is_skipped(tmp_path: Path) -> None:
    cache = tmp_path / "decisions.json"
    for backend in ("inductor", "compile"):
        record_compile(cache, backend, nodes=1, seconds=1000.0)
    program = export_module(SplitNormTanh(n=4).eval(), (torch.randn(8, 64),))
    options = TuneOptions(budget_s=20, backends=["inductor", "compile"], cache_path=cache)
    outcome = tune_program(program, options)
    figures = {f.name: f for f in outcome.config.candidates}
    for name in ("inductor", "compile"):
        assert figures[name].verdict == "not measured"
        assert "skipped: compiling is estimated" in (figures[name].reason or "")


@pytest.mark.slow
def test_a_tight_budget_stops_the_compile_and_ends_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """recsys compiles for about 30 s here (cold cache); a 10 s budget must not wait for it.

    A (wrong) history says the compile is quick, so it is started first, then stopped."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    example = recsys()
    program = export_module(example.module, example.example_inputs)
    record_compile(tmp_path / "c.json", "inductor", nodes=10**5, seconds=1.0)
    options = TuneOptions(
        budget_s=10,
        backends=["inductor"],
        passes=["test_wrong_relu"],  # its sites fail the output check: no time goes to search
        cache_path=tmp_path / "c.json",
        # Quiet, whatever the machine: beside the suite's other workers the estimates grew until
        # checking and timing the compile no longer fitted, and it was never started.
        load=CoreLoad(cores=2),
    )
    started = time.monotonic()
    with registered(WrongRelu):
        outcome = tune_program(program, options)
    assert time.monotonic() - started < 10 + MARGIN_S
    figures = {f.name: f for f in outcome.config.candidates}
    assert figures["inductor"].verdict == "not measured"
    assert "compile stopped" in (figures["inductor"].reason or "")
    assert all(f.verdict == "not measured" for f in figures.values())


@pytest.mark.slow
def test_fxtune_tune_with_a_30_s_budget_ends_within_the_margin(tmp_path: Path) -> None:
    """On the example with the most sites, both peers to build (the budget stops a compile that
    does not fit). The budget on real models, quiet and beside other work, is `make
    bench-zoo`'s (twelve models, wall times in its table): the cnn and transformer examples here
    added 47 s to the suite."""
    model = build("recsys", tmp_path)
    out = tmp_path / "out"
    args = ["tune", str(model), "--out", str(out / "t.pt2"), "--report", str(out / "r.json")]
    args += ["--budget-s", "30", "--cache", str(tmp_path / "c.json")]
    started = time.monotonic()
    result = CliRunner().invoke(app, args)
    took = time.monotonic() - started
    assert result.exit_code == 0, result.output
    assert took < 30 + MARGIN_S, (
        took,
        json.loads((out / "r.json").read_text())["config"]["tuning"],
    )


def test_a_candidate_whose_output_check_would_overrun_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BERT-base here spent 61 s checking one candidate's outputs with 3 s of budget left."""
    monkeypatch.setattr("tuner.tuning.budget.steady_per_call_s", lambda fn: 1.0)  # 1 s a call
    program = export_module(SplitNormTanh(n=4).eval(), (torch.randn(8, 64),))
    options = TuneOptions(budget_s=10, backends=["eager"], cache_path=tmp_path / "c.json")
    started = time.monotonic()
    outcome = tune_program(program, options)
    assert time.monotonic() - started < 10 + MARGIN_S
    assert outcome.config.candidates
    for figures in outcome.config.candidates:
        assert figures.verdict == "not measured"
        assert "skipped: checking its outputs" in (figures.reason or "")
    assert outcome.config.whole_model.name == "original"
    assert outcome.config.verification.passed


def test_every_pass_under_a_peer_that_needs_no_compile_is_judged_with_the_peers() -> None:
    """A CUDA graph is built in a second or two; with every pass under it, it goes with the
    peers, as many as their checks fit in what is left (a compiled peer's does not count)."""
    from types import SimpleNamespace

    from tuner.tuning.budget import Budget

    def cand(name: str, backend: str, passes: bool) -> SimpleNamespace:
        return SimpleNamespace(name=name, backend=backend, passes=["p"] if passes else [])

    first = [cand("cudagraph", "cudagraph", False), cand("inductor", "inductor", False)]
    blind = [
        cand("eager + every pass", "eager", True),
        cand("cudagraph + every pass", "cudagraph", True),
        cand("inductor + every pass", "inductor", True),
    ]
    run = SimpleNamespace(model_time_s=0.01, peer_notes=[], remaining=lambda: 60.0)
    said: list[str] = []
    chosen = Budget(run, None).uncompiled_with_passes(blind, first, lambda _f, m: said.append(m))  # type: ignore[arg-type]
    assert [c.name for c in chosen] == ["cudagraph + every pass"]
    assert run.peer_notes == [
        "cudagraph + every pass needs no compile: it is judged with the peers"
    ]
    assert said == [f"peers: {run.peer_notes[0]}"]
    run.remaining = lambda: 0.5  # not even its check fits
    assert Budget(run, None).uncompiled_with_passes(blind, first, lambda _f, _m: None) == []  # type: ignore[arg-type]
    assert Budget(run, None).uncompiled_with_passes(blind, first[1:], lambda _f, _m: None) == []  # type: ignore[arg-type]


def test_the_fastest_peer_goes_first_where_its_measured_build_fits_alone() -> None:
    """On a CPU at 60 s torch.compile (the quicker build) went first and AOTInductor, faster on
    every zoo model, never fitted after it. Where this machine has built AOTInductor before and
    that build fits alone, it goes first; not on a guess (the prior), nor at several sizes."""
    from types import SimpleNamespace

    from tuner.tuning.budget import Budget

    graph = SimpleNamespace(gm=SimpleNamespace(graph=SimpleNamespace(nodes=[None] * 100)))

    def peer(backend: str) -> SimpleNamespace:
        return SimpleNamespace(name=backend, backend=backend, passes=[], transformed=graph)

    def plan(
        times: CompileTimes,
        points: int = 1,
        kind: str = "cpu",
        left: float = 45.0,
        names: tuple[str, ...] = ("inductor", "compile"),
    ) -> tuple[list, list, list]:
        run = SimpleNamespace(
            model_time_s=0.01,
            peer_notes=[],
            remaining=lambda: left,
            load=SimpleNamespace(shared=False),
            compile_times=times,
            hardware_key="hw",
            options=SimpleNamespace(budget_s=60.0),
            device=SimpleNamespace(kind=kind),
            points=[None] * points,
        )
        first, last = Budget(run, None).plan_peers(  # type: ignore[arg-type]
            [peer(n) for n in names], lambda _f, _m: None
        )
        return [c.name for c in first], [c.name for c in last], run.peer_notes

    measured = CompileTimes(None)
    measured.record("hw", "compile", nodes=100, seconds=20.0)
    measured.record("hw", "inductor", nodes=100, seconds=35.0)
    first, last, notes = plan(measured)
    assert (first, last) == (["inductor"], ["compile"])
    assert any("inductor goes first though it is not the quickest to build" in n for n in notes)
    assert plan(measured, points=2)[:2] == (["compile"], ["inductor"])
    # A runtime peer builds in seconds and was the fastest on 9 of 12 zoo models: not starved.
    with_runtime = plan(measured, names=("inductor", "compile", "openvino"))
    assert with_runtime[:2] == (["openvino", "compile"], ["inductor"])
    assert plan(measured, kind="cuda")[:2] == (["compile"], ["inductor"])
    guessed = CompileTimes(None)  # the prior says AOTInductor fits alone: not enough
    guessed.record("hw", "compile", nodes=100, seconds=15.0)
    assert plan(guessed, left=25.0)[:2] == (["compile"], ["inductor"])


def test_a_build_in_a_child_with_nothing_measured_goes_first_where_half_its_prior_fits() -> None:
    """recsys_dyn's first run at 60 s (no compile history): the runtimes went first and
    AOTInductor, planned at its whole prior (23 s), after the passes, where it never fitted;
    the original with the passes shipped at 0.56x of it. It is started where half its prior
    fits (`compile_wont_fit`), and is grouped so; torch.compile, in this process, is not."""
    from types import SimpleNamespace

    from tuner.backends.compile_time import PRIORS
    from tuner.measure.timing import POOLED
    from tuner.tuning.budget import IN_PROCESS_MARGIN, LEAST_ROUNDS, STOPPABLE_SHARE, Budget

    nodes = 250
    graph = SimpleNamespace(gm=SimpleNamespace(graph=SimpleNamespace(nodes=[None] * nodes)))
    peers = [
        SimpleNamespace(name=b, backend=b, passes=[], transformed=graph)
        for b in ("inductor", "compile", "openvino", "onnxruntime")
    ]

    def plan(left: float) -> tuple[list[str], list[str]]:
        run = SimpleNamespace(
            model_time_s=0.002,
            peer_notes=[],
            remaining=lambda: left,
            load=SimpleNamespace(shared=False),
            compile_times=CompileTimes(None),
            hardware_key="hw",
            options=SimpleNamespace(budget_s=60.0),
            device=SimpleNamespace(kind="cpu"),
            points=[None],
        )
        first, last = Budget(run, None).plan_peers(peers, lambda _f, _m: None)  # type: ignore[arg-type]
        return [c.name for c in first], [c.name for c in last]

    def prior(backend: str) -> float:
        fixed, per_node = PRIORS[backend]
        return fixed + per_node * nodes

    # three input sets to make, and the least timing: eight rounds of blocks with pauses
    check = 21 * 0.002 + 2.0 + LEAST_ROUNDS * POOLED.pauses_per_round(2)
    runtimes = prior("openvino") + prior("onnxruntime") + 2 * check
    assert runtimes + prior("inductor") + check > 40.0  # grouped by the prior, it went last
    assert plan(40.0) == (["openvino", "onnxruntime", "inductor"], ["compile"])
    children = STOPPABLE_SHARE * (prior("openvino") + prior("onnxruntime") + prior("inductor"))
    assert plan(children + 3 * check - 0.1) == (
        ["openvino", "onnxruntime"],
        ["inductor", "compile"],
    )
    everything = children + 4 * check + IN_PROCESS_MARGIN * prior("compile")
    assert plan(everything - 0.1)[1] == ["compile"]
    assert plan(everything)[1] == []


def test_at_several_sizes_the_first_peers_timing_there_is_kept_before_peers_are_built() -> None:
    """distilbert_dyn at 60 s: OpenVINO, ONNX Runtime and torch.compile were built first; then
    OpenVINO's comparison at batch 64 (a quarter second a call) needed 16 s and 7 were left."""
    from types import SimpleNamespace

    from tuner.graph.sizes import SizePoint
    from tuner.tuning.budget import (
        LEAST_ROUNDS,
        MIN_TIMING_S,
        NEW_SET_CALLS,
        SIZE_CALLS,
        UNKNOWN_SETS,
        Budget,
    )

    graph = SimpleNamespace(gm=SimpleNamespace(graph=SimpleNamespace(nodes=[None] * 100)))
    peers = [
        SimpleNamespace(name=b, backend=b, passes=[], transformed=graph)
        for b in ("openvino", "onnxruntime", "compile")
    ]
    times = CompileTimes(None)
    for backend, seconds in (("openvino", 3.0), ("onnxruntime", 3.0), ("compile", 15.0)):
        times.record("hw", backend, nodes=100, seconds=seconds)
    run = SimpleNamespace(
        model_time_s=0.01,
        peer_notes=[],
        remaining=lambda: 41.0,
        timing_budget=lambda: 6.0,
        load=SimpleNamespace(shared=False),
        compile_times=times,
        hardware_key="hw",
        options=SimpleNamespace(budget_s=60.0, whole_model_budget_s=6.0),
        device=SimpleNamespace(kind="cpu"),
        points=[SizePoint(label, {}, ()) for label in ("example", "batch=2", "batch=64")],
        size_time_s={"batch=2": 0.005, "batch=64": 0.25},  # measured: no calls made here
    )
    budget = Budget(run, None)  # type: ignore[arg-type]
    kept = budget.further_sizes_s(lambda: None)
    check = UNKNOWN_SETS * NEW_SET_CALLS  # no inputs to count the sets on: three to make
    pauses = LEAST_ROUNDS * 2 * 0.1  # a runtime's blocks: a pause before each
    assert budget.least_timing_s(0.005) == pytest.approx(MIN_TIMING_S + pauses)
    assert budget.least_timing_s(0.25) == pytest.approx(SIZE_CALLS * 0.25 + pauses)
    least = budget.least_timing_s(0.005) + budget.least_timing_s(0.25)
    assert kept == pytest.approx(least + check * (0.005 + 0.25))
    first, last = budget.plan_peers(peers, lambda _f, _m: None, lambda: None)  # type: ignore[arg-type]
    assert [c.name for c in first] == ["openvino", "onnxruntime"]
    assert [c.name for c in last] == ["compile"]
    assert run.peer_notes[0] == (
        "17 s kept for checking and timing one candidate at the 2 other sizes"
    )
    first, _ = budget.plan_peers(peers, lambda _f, _m: None)  # type: ignore[arg-type]
    assert len(first) == 3  # without the original to time, nothing is kept
    # Peers timed together get a comparison's time per two variants' calls, leaving a check
    # and the further sizes' least (recsys_dyn at 60 s: left none, and the original shipped).
    one = budget.timing_s(lambda: None, 0)
    assert one is not None and budget.together_s(lambda: None, 2) == pytest.approx(1.5 * one)
    run.remaining = lambda: 30.0
    together = budget.together_s(lambda: None, 3)
    assert together == pytest.approx(30.0 - budget.check_s() - kept) and together < 2 * one


def test_a_check_is_planned_by_the_input_sets_it_runs_on_and_the_references_made() -> None:
    """distilbert_dyn at batch 64 beside two busy processes: its check was planned as three
    input sets with their reference outputs to make (40 s with the comparison); its inputs are
    token ids, so the fresh sets are the same one, and once the first candidate made the
    reference's outputs there, the next one's check is its own call."""
    from types import SimpleNamespace

    from tuner.measure.equivalence import ReferenceMemo
    from tuner.tuning.budget import KNOWN_SET_CALLS, NEW_SET_CALLS, Budget
    from tuner.tuning.inference import InferenceStep

    run = SimpleNamespace(references=None)
    kind = InferenceStep(run)  # type: ignore[arg-type]
    budget = Budget(run, kind)  # type: ignore[arg-type]
    ids = (torch.randint(0, 100, (4, 8)), torch.ones(4, 8, dtype=torch.long))
    images = (torch.randn(2, 3, 8, 8),)
    assert budget.check_calls(ids) == NEW_SET_CALLS
    assert budget.check_calls(images) == 3 * NEW_SET_CALLS
    run.references = ReferenceMemo(lambda x: x * 2)
    run.references.expected(kind.check_trials(images)[0])
    assert budget.check_calls(images) == KNOWN_SET_CALLS + 2 * NEW_SET_CALLS
    for trial in kind.check_trials(images):
        run.references.expected(trial)
    assert budget.check_calls(images) == 3 * KNOWN_SET_CALLS
    assert Budget(run, None).check_calls(images) == 3 * NEW_SET_CALLS  # type: ignore[arg-type]


def test_a_further_sizes_call_time_is_read_as_the_checks_reference_there_is_made() -> None:
    """distilbert_dyn at batch 64 beside two busy processes spent 3.4 s on calls that only
    measured the original there, and the first check there made the same calls again."""
    from types import SimpleNamespace

    from tuner.graph.sizes import SizePoint
    from tuner.measure.equivalence import ReferenceMemo
    from tuner.tuning.budget import KNOWN_SET_CALLS, NEW_SET_CALLS, Budget
    from tuner.tuning.inference import InferenceStep

    class Recorded(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.dtypes: list[torch.dtype] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.dtypes.append(x.dtype)
            return x * 2

    original = Recorded()
    memo = ReferenceMemo(original)
    run = SimpleNamespace(
        references=memo,
        reference_memo=lambda reference: memo,
        device=SimpleNamespace(kind="cpu"),
        size_time_s={},
        options=SimpleNamespace(threads=1),
    )
    budget = Budget(run, InferenceStep(run))  # type: ignore[arg-type]
    point = SizePoint("batch=64", {"batch": 64}, (torch.randn(64, 8),))
    call_s = budget._size_call_s(original, point)
    assert call_s == run.size_time_s["batch=64"] == memo.call_s(point.inputs)
    assert original.dtypes.count(torch.float32) == 2  # the reference's own two runs, no more
    assert budget.check_calls(point.inputs) == KNOWN_SET_CALLS + 2 * NEW_SET_CALLS
    assert budget._size_call_s(original, point) == call_s  # once per size and run
    assert original.dtypes.count(torch.float32) == 2


def test_the_originals_calls_at_every_size_are_read_before_the_run_starts_a_child() -> None:
    """`read_original` reads the further sizes' calls too: read later, while the runtimes'
    serving child imported, recsys_dyn's call at batch 4096 took up to 134 ms where it takes
    9-11 ms, and the run kept 25 s of its 60 for that size. `further_sizes_s` then makes no
    call of its own."""
    from types import SimpleNamespace

    from tuner.graph.sizes import SizePoint
    from tuner.tuning.budget import Budget
    from tuner.tuning.run import Captured

    calls: list[int] = []

    def baseline(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return x

    points = [SizePoint(f"batch={n}", {}, (torch.zeros(n),)) for n in (4, 2, 64)]
    run = SimpleNamespace(
        device=SimpleNamespace(kind="cpu"),
        options=SimpleNamespace(threads=None),
        points=points,
        size_time_s={},
        remaining=lambda: 60.0,
    )
    budget = Budget(run, None)  # type: ignore[arg-type]
    budget.read_original(baseline, Captured(None, points[0].inputs, None, []))  # type: ignore[arg-type]
    assert set(run.size_time_s) == {"batch=2", "batch=64"}
    assert {2, 64} <= set(calls)
    made = len(calls)
    budget.further_sizes_s(baseline)
    assert len(calls) == made
