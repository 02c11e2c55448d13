"""The warm checkers (`service.warm_checkers`): a check takes a child started before it, that
child does that one check and exits, a misbehaving one fails its check exactly as a cold child
would, and the next check still gets a warm child. The child here is `tests.service.fake_inspect`
(it overruns or crashes on request), under the service's real sandbox and limits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.analysis import (
    AnalysisLimits,
    CheckRun,
    ProgramAnalysis,
    UnloadableProgram,
    program_analysis,
)
from service.check_folder import CheckFolder
from service.core.config import Settings
from service.warm_checkers import WarmChild
from tests.service.helpers import REPO, pid_alive, wait_for
from tuner.checks.warm import READY, job_line
from tuner.host.sandbox import bwrap_works

FAKE = "tests.service.fake_inspect"
READY_S = 120  # a child's start on a loaded 2-core machine


@pytest.fixture(autouse=True)
def this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """The children import this checkout's code (and the fake), not an installed copy."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def checker(root: Path, warm: int, wall_s: float = 60, sandbox: str = "auto") -> ProgramAnalysis:
    limits = AnalysisLimits(2**30, 60, wall_s, sandbox)  # type: ignore[arg-type]
    analysis = ProgramAnalysis(root, limits, warm=warm, module=FAKE)
    analysis.start()
    return analysis


@pytest.fixture
def warm(tmp_path: Path) -> Iterator[ProgramAnalysis]:
    analysis = checker(tmp_path / "analysis", warm=1, wall_s=5)
    try:
        yield analysis
    finally:
        analysis.close()


@pytest.fixture
def cold(tmp_path: Path) -> ProgramAnalysis:
    return checker(tmp_path / "cold", warm=0, wall_s=5)


def program(tmp_path: Path, text: str) -> Path:
    path = tmp_path / f"{text}.pt2"
    path.write_text(text)
    return path


def ready_pid(analysis: ProgramAnalysis) -> int:
    assert analysis.pool is not None
    assert analysis.pool.wait_ready(READY_S), "no warm child got ready"
    (pid,) = analysis.pool.waiting_pids()
    return pid


def error_of(analysis: ProgramAnalysis, path: Path) -> str:
    with pytest.raises(UnloadableProgram) as refused:
        analysis.fingerprint(path)
    return str(refused.value)


def test_a_check_is_done_by_the_waiting_child_which_then_exits(
    warm: ProgramAnalysis, tmp_path: Path
) -> None:
    first = ready_pid(warm)
    assert warm.fingerprint(program(tmp_path, "one")) == "one"
    assert warm.recent[-1].warm and warm.recent[-1].was_ready and warm.recent[-1].pid == first
    assert not pid_alive(first)  # one check, one process
    second = ready_pid(warm)  # its replacement, started at once
    assert second != first
    assert warm.fingerprint(program(tmp_path, "two")) == "two"
    assert warm.recent[-1] == CheckRun(True, True, second, warm.recent[-1].seconds)
    assert not pid_alive(second)


def test_control_without_warm_checkers_every_check_starts_its_own(
    cold: ProgramAnalysis, tmp_path: Path
) -> None:
    assert cold.pool is None
    assert cold.fingerprint(program(tmp_path, "one")) == "one"
    assert not cold.recent[-1].warm and cold.recent[-1].pid is None


def test_fxtune_warm_checkers_sets_the_pool_and_0_turns_it_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FXTUNE_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("FXTUNE_WARM_CHECKERS")  # the suite turns them off (tests/conftest.py)
    default = program_analysis(Settings())
    assert default.pool is not None and default.pool.size == 1
    monkeypatch.setenv("FXTUNE_WARM_CHECKERS", "3")
    assert program_analysis(Settings()).pool.size == 3  # type: ignore[union-attr]
    monkeypatch.setenv("FXTUNE_WARM_CHECKERS", "0")
    assert program_analysis(Settings()).pool is None


def test_a_warm_child_runs_one_job_and_exits(tmp_path: Path) -> None:
    """The protocol itself: a second job written to the same child is never run."""
    for name in ("a", "b"):
        (tmp_path / f"{name}.pt2").write_text(name)
    jobs = "".join(job_line(["fingerprint", f"{n}.pt2", "--out", f"{n}.json"]) for n in "ab")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", FAKE, "warm"],
        input=jobs,
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == READY
    assert json.loads((tmp_path / "a.json").read_text())["fingerprint"] == "a"
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("how", ["sleep", "crash", "refuse"])
def test_a_misbehaving_warm_child_fails_as_a_cold_one_and_the_next_check_works(
    warm: ProgramAnalysis, cold: ProgramAnalysis, tmp_path: Path, how: str
) -> None:
    pid = ready_pid(warm)
    warm_error = error_of(warm, program(tmp_path, how))
    assert warm.recent[-1].warm and warm.recent[-1].pid == pid
    assert not pid_alive(pid)
    assert warm_error == error_of(cold, program(tmp_path, how))
    expected = {
        "sleep": "took longer than its 5 s limit",
        "crash": "failed within its limits",
        "refuse": "cannot be loaded safely: refused: the fake says no",
    }
    assert expected[how] in warm_error
    ready_pid(warm)
    assert warm.fingerprint(program(tmp_path, "after")) == "after"
    assert warm.recent[-1].warm and warm.recent[-1].was_ready


def test_an_answer_past_the_cap_is_refused_unread(cold: ProgramAnalysis, tmp_path: Path) -> None:
    """A subverted child may write any amount; the service reads at most MAX_RESULT_BYTES."""
    assert "over 1048576 bytes" in error_of(cold, program(tmp_path, "huge"))
    assert cold.fingerprint(program(tmp_path, "small")) == "small"  # control: an answer is read


def test_a_warm_child_that_died_before_its_job_leaves_the_check_to_a_cold_one(
    warm: ProgramAnalysis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ready_pid(warm)
    assert warm.pool is not None
    dead = warm.pool.take()
    assert dead is not None
    os.killpg(dead.pid, signal.SIGKILL)
    wait_for(lambda: dead.ended, 30, "the killed child's output to end")
    monkeypatch.setattr(warm.pool, "take", lambda: dead)
    assert warm.fingerprint(program(tmp_path, "ok")) == "ok"
    assert not warm.recent[-1].warm


def test_two_checks_at_once_each_get_their_own_child(warm: ProgramAnalysis, tmp_path: Path) -> None:
    ready_pid(warm)
    answers: dict[str, str] = {}

    def check(text: str) -> None:
        answers[text] = warm.fingerprint(program(tmp_path, text))

    threads = [threading.Thread(target=check, args=(t,)) for t in ("left", "right")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert answers == {"left": "left", "right": "right"}
    # One took the warm child, the other its replacement or a cold one; either may end first
    # (on loaded cores a cold check ended before the warm one once).
    first, second = list(warm.recent)[-2:]
    assert (first.warm or second.warm) and first.pid != second.pid


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run on this machine")
def test_the_checked_file_is_read_only_to_the_child(warm: ProgramAnalysis, tmp_path: Path) -> None:
    ready_pid(warm)
    upload = program(tmp_path, "edit")
    assert warm.fingerprint(upload) == "cannot edit: Read-only file system"
    assert upload.read_text() == "edit"


def test_control_unsandboxed_the_child_could_edit_the_file(tmp_path: Path) -> None:
    """Why the inputs are bound read-only: the child's copy is a hard link to the upload."""
    analysis = checker(tmp_path / "analysis", warm=0, sandbox="none")
    upload = program(tmp_path, "edit")
    assert analysis.fingerprint(upload) == "edited"
    assert upload.read_text() == "edited"


def test_close_stops_the_waiting_children_and_removes_their_folders(tmp_path: Path) -> None:
    analysis = checker(tmp_path / "analysis", warm=2)
    assert analysis.pool is not None
    wait_for(lambda: len(analysis.pool.waiting_pids()) == 2, 30, "two warm children")  # type: ignore[union-attr]
    pids = analysis.pool.waiting_pids()
    assert all(pid_alive(p) for p in pids)  # control
    analysis.close()
    assert not any(pid_alive(p) for p in pids)
    assert list((tmp_path / "analysis").iterdir()) == []


def test_a_restart_removes_folders_of_dead_processes_only(tmp_path: Path) -> None:
    root = tmp_path / "analysis"
    live = CheckFolder(root, "check-")
    code = "import sys, pathlib, service.check_folder as f\n"
    code += "f.CheckFolder(pathlib.Path(sys.argv[1]), 'w-')"
    subprocess.run([sys.executable, "-c", code, str(root)], check=True, cwd=REPO, timeout=60)
    assert len(list(root.glob("w-*.lock"))) == 1  # the dead process's, left behind
    assert CheckFolder.clear_leftovers(root) == 1
    kept = sorted(p.name for p in root.iterdir())
    assert kept == sorted([live.path.name, live.path.name + ".lock"])
    live.remove()
    assert list(root.iterdir()) == []


def test_stopping_a_child_between_two_reads_ends_its_reader_quietly(tmp_path: Path) -> None:
    """`stop` closes the pipe a reader thread reads; a reader still busy with the last line
    (here: telling the pool the child is ready) must then end as at the pipe's end, not die
    with "I/O operation on closed file" (pytest's filter makes that a failure)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", f"print({READY!r}, flush=True); import time; time.sleep(60)"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    busy = threading.Event()

    def slow_to_note(child: WarmChild) -> None:
        if child.ready and not busy.is_set():
            busy.set()
            time.sleep(1.0)

    child = WarmChild(proc, CheckFolder(tmp_path, "c-"), slow_to_note)
    assert busy.wait(READY_S)
    child.stop()
    child.reader.join(timeout=10)
    assert child.ended and not child.reader.is_alive()
    assert not pid_alive(proc.pid)
