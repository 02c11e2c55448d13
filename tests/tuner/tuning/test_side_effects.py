"""A tuning run leaves the process and the temp directory as it found them.

Profiles are on. With the inductor backend the run starts a compile that its budget stops
mid-way: the killed child compile must leave nothing behind. (The profile of a finished inductor
result builds its twin package in a temporary folder it removes, `tuner.tuning.outputs`; a
compile in a fresh temp folder takes over 20 s here, so the suite does not wait for one.)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fxtune_cli import app
from tests.tuner.tuning_fixtures import SplitNormTanh, record_compile
from tuner.graph.capture import export_module, save_program
from tuner.tuning.tuner import TuneOptions, tune_program


def _tune_args(
    model: Path, out: Path, cache: Path, backend: str, threads: int, budget_s: int
) -> list[str]:
    return [
        "tune",
        str(model),
        "--out",
        str(out / "tuned.pt2"),
        "--report",
        str(out / "report.json"),
        "--budget-s",
        str(budget_s),
        "--backend",
        backend,
        "--threads",
        str(threads),
        "--cache",
        str(cache),
    ]


def _private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Its own temp directory; inductor's compile cache (a cache meant to persist) kept apart."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setenv("TMPDIR", str(private))
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor-cache"))
    return private


def _left_behind(folder: Path, before: list[str]) -> list[str]:
    """New entries, except inductor's own compile cache (`torchinductor_<user>`): one folder
    meant to persist and be reused by every later compile, which some of inductor's caches
    place under the temp directory whatever TORCHINDUCTOR_CACHE_DIR says."""
    return sorted(
        p.name
        for p in folder.iterdir()
        if p.name not in before and not p.name.startswith("torchinductor_")
    )


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_tune_leaves_no_temp_files_and_restores_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    program = export_module(SplitNormTanh(n=4).eval(), (torch.randn(8, 64),))
    model = save_program(program, tmp_path / "m.pt2")
    private = _private_tmp(tmp_path, monkeypatch)
    threads = torch.get_num_threads()
    other = 1 if threads > 1 else 2
    before = sorted(p.name for p in private.iterdir())
    cache = tmp_path / "c.json"
    if backend == "inductor":
        # A cold compile in a fresh temp folder takes over 20 s here (precompiled headers and
        # the compiler's probes first): a history saying it is quick starts it at once, and the
        # budget stops it mid-way, the case that could leave files behind.
        record_compile(cache, "inductor", nodes=10**5, seconds=1.0, threads=other)
    args = _tune_args(model, tmp_path / "out", cache, backend, other, budget_s=10)
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _left_behind(private, before) == []
    assert torch.get_num_threads() == threads
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    built = [c for c in report["config"]["candidates"] if c["backend"] == backend]
    # A package was built, or a compile was stopped mid-way: neither may leave files behind.
    compiled = [
        c
        for c in built
        if c["verdict"] not in ("not measured", "failed to run")
        or "compile stopped" in (c["reason"] or "")
    ]
    assert compiled, built


def test_tune_program_restores_the_thread_count(tmp_path: Path) -> None:
    program = export_module(SplitNormTanh(n=2).eval(), (torch.randn(4, 32),))
    threads = torch.get_num_threads()
    other = 1 if threads > 1 else 2
    options = TuneOptions(budget_s=4, backends=["eager"], threads=other)
    outcome = tune_program(program, options)
    assert outcome.config.hardware["threads"] == other
    assert torch.get_num_threads() == threads
