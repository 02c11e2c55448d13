"""Crash isolation: a compiled candidate that kills its process is recorded, and tuning goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.tuner.tuning_fixtures import SplitNormTanh
from tuner.backends import isolation
from tuner.graph.capture import export_module
from tuner.tuning.tuner import TuneOptions, tune_program

CRASHING = "tests.tuner.backends.crashing_child"


@pytest.mark.serial
@pytest.mark.slow
def test_crashing_candidates_are_recorded_and_tuning_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the child ran the package, a segfaulting package killed the tuner, and the worker
    retried the whole job into the same crash. torch.compile (and CUDA graphs) build inside the
    process that runs them; with `isolate_compiles` (the default on CUDA) a child builds and
    runs each first, so a crash there ends the candidate, not the run."""
    monkeypatch.setattr(isolation, "CHILD_MODULE", CRASHING)
    program = export_module(SplitNormTanh(n=4).eval(), (torch.randn(8, 64),))
    options = TuneOptions(
        budget_s=60,
        backends=["eager", "inductor", "compile"],
        passes=["fuse_horizontal_layernorm"],
        cache_path=tmp_path / "c",
        isolate_compiles=True,
    )
    outcome = tune_program(program, options)
    figures = {f.name: f for f in outcome.config.candidates}
    for backend, what in (("inductor", "the package"), ("compile", "under compile")):
        crashed = [f for f in figures.values() if f.backend == backend]
        assert crashed and all(f.verdict == "crashed" for f in crashed), figures
        assert all("SIGSEGV (signal 11)" in (f.reason or "") for f in crashed)
        assert all(what in (f.reason or "") for f in crashed)
    eager = [f for f in figures.values() if f.backend == "eager"]
    assert any(f.verdict in ("faster", "slower", "within noise") for f in eager), figures
    assert outcome.config.whole_model.backend == "eager"
    assert outcome.config.verification.passed
