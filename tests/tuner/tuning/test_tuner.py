"""Whole-model tuning: never worse than the original, reproducible from its config alone."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.export import ExportedProgram
from typer.testing import CliRunner

from fxtune_cli import app
from tests.tuner.tuning_fixtures import (
    ReluNet,
    SlowRelu,
    SplitNormTanh,
    record_compile,
    registered,
)
from tuner.contract.config import TunedConfig
from tuner.deploy.replay import apply_config
from tuner.graph.capture import export_module, save_program
from tuner.host.load import CoreLoad
from tuner.measure.timing import fixed_threads
from tuner.tuning.tuner import TuneOptions, tune_program


def _program(module: nn.Module, *inputs: torch.Tensor) -> ExportedProgram:
    return export_module(module.eval(), inputs)


@pytest.mark.serial
@pytest.mark.slow
def test_tuning_fuses_the_seed_pattern_and_replays_exactly(tmp_path: Path) -> None:
    program = _program(SplitNormTanh(), torch.randn(32, 24 * 16))
    options = TuneOptions(budget_s=40, backends=["eager"], cache_path=tmp_path / "c.json")
    outcome = tune_program(program, options)
    config = outcome.config
    assert config.verification.passed
    assert config.backend == "eager"
    fused = {step.pass_name for step in config.passes}
    assert "fuse_horizontal_layernorm" in fused
    assert config.whole_model.verdict == "faster"
    assert config.whole_model.ci is not None and config.whole_model.ci[0] > 1.0

    replayed = apply_config(program, TunedConfig.from_json(config.to_json()))
    assert replayed.gm.code == outcome.tuned.gm.code
    x = torch.randn(32, 24 * 16)
    torch.testing.assert_close(replayed.gm(x), program.module()(x), rtol=1e-5, atol=1e-5)


@pytest.mark.serial
@pytest.mark.slow
def test_beside_other_work_on_one_thread_the_run_times_by_cpu_time(tmp_path: Path) -> None:
    """The load is given (the machine itself may be quiet): two cores busy and one thread, so
    every comparison of the run counts this process's CPU time, and the report says so."""
    program = _program(SplitNormTanh(), torch.randn(32, 24 * 16))
    options = TuneOptions(
        budget_s=20, backends=["eager"], threads=1, load=CoreLoad(2, busy=2.0), workdir=tmp_path
    )
    with fixed_threads(1):
        config = tune_program(program, options).config
    assert config.tuning["clock"] == "cpu"
    assert any("timed by this process's CPU time" in n for n in config.tuning["peers"])
    assert "fuse_horizontal_layernorm" in {step.pass_name for step in config.passes}
    quiet = TuneOptions(budget_s=1, backends=["eager"], threads=1, load=CoreLoad(2))
    assert tune_program(program, quiet).config.tuning["clock"] == "wall"


def test_original_stands_when_nothing_is_faster(tmp_path: Path) -> None:
    # One thread, as test_retuning_reuses_the_cache: beside another test's compile, two threads
    # stalled and the site timed slower than the whole model twice ("inconsistent", not trusted).
    with registered(SlowRelu):
        options = TuneOptions(budget_s=20, backends=["eager"], passes=["test_slow_relu"], threads=1)
        outcome = tune_program(_program(ReluNet(), torch.randn(64, 64)), options)
    config = outcome.config
    assert config.passes == []
    assert config.backend == "eager"
    assert config.whole_model.name == "original"
    assert "original stands" in (config.whole_model.reason or "")
    assert [s.verdict for s in config.sites] == ["slower"], [s.reason for s in config.sites]


@pytest.mark.slow
def test_retuning_reuses_the_cache(tmp_path: Path) -> None:
    program = _program(SplitNormTanh(n=8), torch.randn(16, 8 * 16))
    # One thread: on cores shared with other tests, two threads stall mid-measurement and the
    # sites read as slower than the whole model ("inconsistent", never cached).
    options = TuneOptions(
        budget_s=30, backends=["eager"], cache_path=tmp_path / "c.json", threads=1
    )
    first = tune_program(program, options).config
    second = tune_program(program, options).config
    measured = [s for s in first.sites if s.verdict != "not measured"]
    assert measured, [(s.site_id, s.reason) for s in first.sites]
    assert second.tuning["cache_hits"] == len(measured)
    assert second.tuning["timed_candidates"] < first.tuning["timed_candidates"]
    assert [(s.site_id, s.verdict) for s in second.sites] == [
        (s.site_id, s.verdict) for s in first.sites
    ]


@pytest.mark.slow
def test_cli_tune_writes_program_and_report(tmp_path: Path) -> None:
    model = save_program(_program(SplitNormTanh(n=8), torch.randn(16, 128)), tmp_path / "m.pt2")
    out, report = tmp_path / "out" / "tuned.pt2", tmp_path / "out" / "report.json"
    result = CliRunner().invoke(
        app,
        [
            "tune",
            str(model),
            "--out",
            str(out),
            "--report",
            str(report),
            "--budget-s",
            "8",  # what is asserted is the files and their structure, not what tuning found
            "--backend",
            "eager",
            "--progress-json",
            "--cache",
            str(tmp_path / "c.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    progress = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert progress[-1]["progress"] == 1.0
    doc = json.loads(report.read_text())
    assert set(doc) >= {"config", "profiles", "artifacts", "samples", "outputs_s"}
    assert set(doc["outputs_s"]) == {"export", "package", "profiles"}  # each step's seconds
    assert doc["outputs_s"]["profiles"] > 0
    assert doc["artifacts"]["program"] == "tuned.pt2"
    assert set(doc["profiles"]) == {"baseline", "tuned"}
    assert (report.parent / doc["artifacts"]["traces"]["baseline"]).exists()
    TunedConfig.model_validate(doc["config"])
    tuning = doc["config"]["tuning"]
    steps = tuning["seconds_by_step"]  # where the budget went, each step once
    assert {"loading", "capture", "site search", "verification", "other"} <= set(steps)
    assert abs(sum(steps.values()) - tuning["seconds"]) < 0.1
    assert "where the time went: " in result.output
    tuned = torch.export.load(out).module()
    x = torch.randn(16, 128)
    original = torch.export.load(model).module()
    torch.testing.assert_close(tuned(x), original(x), rtol=1e-5, atol=1e-5)


def test_cli_refuses_a_non_archive(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pt2"
    junk.write_text("nope")
    result = CliRunner().invoke(
        app,
        [
            "tune",
            str(junk),
            "--out",
            str(tmp_path / "o.pt2"),
            "--report",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 2
    assert "text file, not a torch.export program" in result.output


@pytest.mark.serial
@pytest.mark.slow
def test_the_peers_are_timed_before_any_site_is_searched(tmp_path: Path) -> None:
    """The peers are the floor: they are built and timed first, whatever the search finds."""
    said: list[str] = []
    program = _program(SplitNormTanh(n=4), torch.randn(16, 4 * 16))
    options = TuneOptions(
        budget_s=25,
        backends=["eager", "compile"],
        workdir=tmp_path,
        load=CoreLoad(2),  # the plan as on a quiet machine, whatever else the cores are doing
    )
    outcome = tune_program(program, options, lambda _f, message: said.append(message))
    peer = said.index("timing whole model: compile")
    search = next(i for i, m in enumerate(said) if m.startswith("searching "))
    assert peer < search, said
    config = outcome.config
    assert config.candidates[0].name == "compile" and config.candidates[0].rounds > 0
    assert any(note.startswith("compile:") for note in config.tuning["peers"])
    counts = config.tuning["site_counts"]
    assert counts["distinct"] == len(config.sites) > 0
    assert counts["timed"] + counts["below_noise"] + counts["out_of_budget"] <= counts["distinct"]


def test_peers_not_expected_to_fit_are_announced_and_go_last(tmp_path: Path) -> None:
    """With nothing measured on this machine, the prior says torch.compile will not fit in 3 s
    (it expects 2 s and more, and the output check 2 s): the report says so with the budget it
    needs, the passes go first, and a compile in this process (which nothing could stop) is not
    started."""
    said: list[str] = []
    program = _program(SplitNormTanh(n=4), torch.randn(16, 4 * 16))
    options = TuneOptions(budget_s=3, backends=["eager", "compile"], workdir=tmp_path)
    started = time.monotonic()
    outcome = tune_program(program, options, lambda _f, message: said.append(message))
    assert time.monotonic() - started < 3 + 15
    notes = " ".join(outcome.config.tuning["peers"])
    assert "no peer is expected to fit" in notes and "a budget of about" in notes
    search = next(i for i, m in enumerate(said) if m.startswith("searching "))
    assert said.index("timing whole model: compile") > search
    peer = next(f for f in outcome.config.candidates if f.name == "compile")
    assert peer.verdict == "not measured" and peer.rounds == 0  # never started


@pytest.mark.serial
def test_a_peer_expected_not_to_fit_goes_after_the_passes_and_the_others_first(
    tmp_path: Path,
) -> None:
    """torch.compile is expected to fit and goes first; AOTInductor, which this machine's
    history says needs 1000 s, waits until after the search instead of holding it up."""
    cache = record_compile(tmp_path / "decisions.json", "inductor", nodes=10, seconds=1000.0)
    said: list[str] = []
    program = _program(SplitNormTanh(n=4), torch.randn(16, 4 * 16))
    options = TuneOptions(
        budget_s=30,
        backends=["eager", "compile", "inductor"],
        cache_path=cache,
        workdir=tmp_path,
        load=CoreLoad(2),
    )
    outcome = tune_program(program, options, lambda _f, message: said.append(message))
    notes = " ".join(outcome.config.tuning["peers"])
    assert "compile first" in notes and "inductor after the passes" in notes, notes
    search = next(i for i, m in enumerate(said) if m.startswith("searching "))
    assert (
        said.index("timing whole model: compile")
        < search
        < said.index("timing whole model: inductor")
    ), said
    late = next(f for f in outcome.config.candidates if f.name == "inductor")
    assert late.verdict == "not measured" and late.rounds == 0  # never started: 1000 s


@pytest.mark.serial
def test_when_no_peer_fits_the_quickest_compile_with_every_pass_goes_first(
    tmp_path: Path,
) -> None:
    """This machine's history says torch.compile of the 87-node original will not fit in the
    32 s a 40 s budget has for tuning, but of the 15 nodes left after every pass it will: that
    candidate is built and timed before the site search, after every pass in eager (no
    compile), and the report says why. The figures leave room for a slow start: at 13 s and a
    4 s history, a loaded machine's start and eager timing left too little for the compile."""
    # 87 nodes: 32 s
    cache = record_compile(tmp_path / "decisions.json", "compile", nodes=15, seconds=12.0)
    said: list[str] = []
    program = _program(SplitNormTanh(n=16), torch.randn(16, 16 * 16))
    options = TuneOptions(
        budget_s=40,
        backends=["eager", "compile"],
        cache_path=cache,
        workdir=tmp_path,
        load=CoreLoad(2),  # the history's 12 s as measured, whatever else the cores are doing
    )
    started = time.monotonic()
    outcome = tune_program(program, options, lambda _f, message: said.append(message))
    assert time.monotonic() - started < 40 + 15
    notes = " ".join(outcome.config.tuning["peers"])
    assert "no peer is expected to fit" in notes
    assert "compile + every pass (15 nodes) is expected to fit" in notes
    assert "eager + every pass needs no compile: it goes first" in notes
    search = next(i for i, m in enumerate(said) if m.startswith("searching "))
    eager = said.index("timing whole model: eager + every pass")
    assert eager < said.index("timing whole model: compile + every pass") < search
    early = next(f for f in outcome.config.candidates if f.name == "compile + every pass")
    assert early.rounds > 0 or (early.reason or "").startswith("skipped: checking")


class Pointwise(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(40):
            x = torch.tanh(x * 1.01 + 0.1) if i % 2 else torch.sigmoid(x - 0.2)
        return x


@pytest.mark.slow
def test_inductors_settings_are_built_on_its_fastest_candidate_and_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One setting here (a real AOTInductor compile each): built with its values after the
    default build, checked and timed as every candidate, its compile time kept apart. A 120 s
    budget, as a settings build is planned at twice the default one's time, which beside the
    suite's other workers did not always fit in 60 s (the run ends when its candidates do).
    On one thread: on two, beside the suite's other workers, a kernel waits for its
    descheduled thread, and the freezing package glanced at 6x the original's 0.6 ms in two
    attempts running (recorded clearly slower, not timed)."""
    from tuner.backends import inductor_settings

    monkeypatch.setitem(inductor_settings.SETTINGS, "cpu", {"freezing": {"freezing": True}})
    program = _program(Pointwise(), torch.randn(8, 256))  # inductor fuses it: several x eager
    cache = tmp_path / "decisions.json"
    options = TuneOptions(
        budget_s=120,
        backends=["inductor"],
        passes=["remove_dropout"],
        cache_path=cache,
        workdir=tmp_path,
        threads=1,
    )
    config = tune_program(program, options).config
    names = [f.name for f in config.candidates]
    assert names.index("inductor") < names.index("inductor [freezing]")
    built = next(f for f in config.candidates if f.settings == "freezing")
    assert built.backend == "inductor" and built.rounds > 0 and built.build_s, built
    again = TunedConfig.model_validate_json(config.to_json())
    assert again.whole_model.settings == config.whole_model.settings
    times = json.loads((tmp_path / "compile_times.json").read_text())
    assert any(k.endswith("::inductor@freezing") for k in times), times
