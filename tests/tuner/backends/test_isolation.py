"""Crash isolation: a compiled candidate that kills its process is recorded, and tuning goes on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tuner.tuning_fixtures import SplitNormTanh
from tuner.backends import isolation
from tuner.graph.capture import export_module
from tuner.host.load import CoreLoad
from tuner.measure.timing import fixed_threads
from tuner.tuning.tuner import TuneOptions, tune_program

CRASHING = "tests.tuner.backends.crashing_child"


@pytest.mark.slow
def test_crashing_candidates_are_recorded_and_tuning_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the child ran the package, a segfaulting package killed the tuner, and the worker
    retried the whole job into the same crash. torch.compile builds inside the process that
    runs it; with `isolate_compiles` (the default on CUDA) a child builds and
    runs each first, so a crash there ends the candidate, not the run."""
    monkeypatch.setattr(isolation, "CHILD_MODULE", CRASHING)
    program = export_module(SplitNormTanh(n=4).eval(), (torch.randn(8, 64),))
    options = TuneOptions(
        budget_s=60,
        backends=["eager", "inductor", "compile"],
        passes=["fuse_horizontal_layernorm"],
        cache_path=tmp_path / "c",
        isolate_compiles=True,
        # Quiet, whatever the machine: beside the suite's other worker the compiles' estimates
        # doubled and the AOTInductor build was skipped, never crashing.
        load=CoreLoad(cores=2),
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
    assert _waiting_children() == set()  # the child started ahead ended with the session


def _waiting_children() -> set[int]:
    """This process's children that wait for a compile job (`tuner.backends.child --wait`)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"--wait" in cmdline and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def _saved_program(tmp_path: Path) -> Path:
    path = tmp_path / "program.pt2"
    torch.export.save(export_module(torch.nn.Linear(4, 2).eval(), (torch.randn(3, 4),)), path)
    return path


def test_children_started_ahead_do_one_job_each_and_end_with_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next child starts while the current one works, so a job waits only for its own
    work; each child still does one job (a crash ends only its own), and none outlives the
    run."""
    path = _saved_program(tmp_path)
    with isolation.Children(ahead=True) as children:
        children.start()
        first = _waiting_children()
        assert len(first) == 1
        monkeypatch.setattr(isolation, "CHILD_MODULE", CRASHING)
        # the job goes to the child already waiting (a real one); the one after it crashes
        done = isolation.probe_in_child(path, "eager", timeout_s=120, children=children)
        assert 0 <= done.compile_s <= done.seconds
        second = _waiting_children()
        assert len(second) == 1 and second != first  # the first did its job and ended
        with pytest.raises(isolation.CompileCrashed, match="SIGSEGV"):
            isolation.probe_in_child(path, "compile", timeout_s=120, children=children)
        third = _waiting_children()
        assert len(third) == 1 and third != second
    assert _waiting_children() == set()


def test_without_children_each_compile_starts_its_own(tmp_path: Path) -> None:
    done = isolation.probe_in_child(_saved_program(tmp_path), "eager", timeout_s=120)
    assert done.compile_s <= done.seconds
    assert _waiting_children() == set()


def test_a_child_builds_on_the_machine_s_threads_whatever_the_tuner_measures_on(
    tmp_path: Path,
) -> None:
    """Inductor's CPU code depends on torch's thread count while it builds: built on one
    thread, vit_tiny's package had no OpenMP loops and ran 0.95x of the two-thread build on two
    threads. A run measuring on one thread (beside other work, or `--threads 1`) must still ship
    a package built for the machine."""
    machine = torch.get_num_threads()
    if machine < 2:
        pytest.skip("one thread here: nothing to tell apart")
    with fixed_threads(1):
        done = isolation.probe_in_child(_saved_program(tmp_path), "eager", timeout_s=120)
    assert done.threads == machine


def test_a_child_s_precompiled_headers_go_to_this_process_s_inductor_folder(
    tmp_path: Path,
) -> None:
    """torch puts AOTInductor's precompiled headers under the temp folder whatever
    TORCHINDUCTOR_CACHE_DIR says; each child has a temp folder of its own, so every AOTInductor
    build made them again (12 s of g++ of a 25 s MLP build here) and threw them away. The
    child's folder links to this process's, and removing the child's leaves that one."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    isolation._share_inductor_home(str(scratch))
    where = subprocess.run(
        [
            sys.executable,
            "-c",
            "from torch._inductor import codecache; print(codecache._HEADER_DIR)",
        ],
        env=isolation._child_env(str(scratch)),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    home = Path(isolation._inductor_home())
    assert Path(where).resolve() == (home / "precompiled_headers").resolve()
    shutil.rmtree(scratch)
    assert home.is_dir()
