"""The suite's rules for sharing the machine between xdist workers (tests/parallel.py), and
what it prints about reruns (tests/reruns.py)."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.parallel import (
    Turns,
    durations_of,
    longest_files_first,
    recorded_durations,
    summary,
    turn,
)
from tests.reruns import RERUN_LINES, FirstFailures


def _holds(folder: Path, serial: bool, entered: threading.Event, leave: threading.Event) -> None:
    with turn(folder, serial):
        entered.set()
        leave.wait(10)


def _start(folder: Path, serial: bool) -> tuple[threading.Event, threading.Event]:
    """A thread that takes a turn (its own open files: flock locks them against each other)
    and holds it until told to leave."""
    entered, leave = threading.Event(), threading.Event()
    threading.Thread(target=_holds, args=(folder, serial, entered, leave), daemon=True).start()
    return entered, leave


def test_tests_share_the_machine_and_a_serial_one_waits_for_it_alone(tmp_path: Path) -> None:
    first, leave_first = _start(tmp_path, serial=False)
    assert first.wait(5)
    second, leave_second = _start(tmp_path, serial=False)
    assert second.wait(5)  # the control: two ordinary tests run side by side
    alone, leave_alone = _start(tmp_path, serial=True)
    assert not alone.wait(0.5)  # the serial test waits for both
    leave_first.set()
    assert not alone.wait(0.3)
    late, leave_late = _start(tmp_path, serial=False)
    leave_second.set()
    assert alone.wait(5)  # ... and goes before a test that came after it
    assert not late.wait(0.5)  # which waits in turn
    leave_alone.set()
    assert late.wait(5)
    leave_late.set()


def test_a_run_of_serial_tests_keeps_the_machine_until_its_last_and_is_timed(
    tmp_path: Path,
) -> None:
    timeline = tmp_path / "timeline.jsonl"
    turns = Turns(tmp_path, timeline)
    with turns.turn("first", serial=True, next_serial=True):
        pass
    other, leave_other = _start(tmp_path, serial=False)
    assert not other.wait(0.5)  # between the two serial tests the machine stays taken
    with turns.turn("second", serial=True, next_serial=False):
        pass
    assert other.wait(5)  # released after the last of the run
    with turns.turn("ordinary", serial=False, next_serial=False):
        pass  # an ordinary test beside the other ordinary one
    leave_other.set()
    lines = [json.loads(line) for line in timeline.read_text().splitlines()]
    assert [(t["test"], t["serial"]) for t in lines] == [
        ("first", True),
        ("second", True),
        ("ordinary", False),
    ]
    assert all(t["asked"] <= t["got"] <= t["ended"] for t in lines)
    report = summary(timeline).splitlines()
    assert report[0].startswith("3 tests over") and report[-1].startswith("serial: 2 tests")
    assert report[1].startswith(f"worker {lines[0]['worker']}: 3 tests, running")
    assert "s (CPU " in report[1] and all(t["cpu_s"] >= 0 for t in lines)


@dataclass
class _Item:
    path: Path
    markers: set[str] = field(default_factory=set)

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.markers else None


@dataclass
class _Node(_Item):
    name: str = ""

    @property
    def nodeid(self) -> str:
        return f"{self.path}::{self.name}"


def test_the_longest_files_are_handed_out_first() -> None:
    """A file weighs its selected tests' recorded seconds; a test with no record counts 1 s, or
    30 s when marked slow; each file's tests keep their order."""
    items = [
        _Node(Path("a.py"), name="quick"),
        _Node(Path("b.py"), name="one"),
        _Node(Path("b.py"), {"slow"}, name="two"),  # unrecorded: 30 s
        _Node(Path("c.py"), name="long"),
        _Node(Path("c.py"), name="new"),  # unrecorded: 1 s
        _Node(Path("d.py"), name="quick"),
    ]
    durations = {"a.py::quick": 2.0, "b.py::one": 5.0, "c.py::long": 40.0, "d.py::quick": 0.5}
    longest_files_first(items, durations)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "c.py::long",
        "c.py::new",
        "b.py::one",
        "b.py::two",
        "a.py::quick",
        "d.py::quick",
    ]


def test_a_timeline_gives_each_test_s_seconds_and_they_read_back(tmp_path: Path) -> None:
    timeline = tmp_path / "timeline.jsonl"
    rows = [
        {"test": "b.py::t", "got": 10.0, "ended": 12.54},
        {"test": "a.py::t", "got": 1.0, "ended": 1.04},
        {"test": "b.py::t", "got": 20.0, "ended": 21.0},  # a rerun: the last one counts
    ]
    timeline.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert list(durations_of(timeline).items()) == [("a.py::t", 0.0), ("b.py::t", 1.0)]
    recorded = tmp_path / "durations.json"
    recorded.write_text(json.dumps(durations_of(timeline)))
    assert recorded_durations(recorded) == {"a.py::t": 0.0, "b.py::t": 1.0}
    assert recorded_durations(tmp_path / "missing.json") == {}
    (tmp_path / "bad.json").write_text("[1, 2")
    assert recorded_durations(tmp_path / "bad.json") == {}


def test_the_recorded_durations_name_tests_that_exist() -> None:
    """tests/durations.json is read, and most of its ids are tests of this tree (a stale file
    only orders worse; a wrong path would order nothing)."""
    recorded = recorded_durations()
    assert len(recorded) > 500
    files = {test.split("::")[0] for test in recorded}
    root = Path(__file__).resolve().parents[1]
    assert sum((root / f).is_file() for f in files) >= 0.9 * len(files)


@pytest.mark.serial
def test_a_serial_test_runs_alone_under_xdist(request: pytest.FixtureRequest) -> None:
    """Through the hook (tests/conftest.py): the lock is held while this test runs."""
    from tests.parallel import lock_folder

    folder = lock_folder(request.config)
    if folder is None:
        pytest.skip("not under xdist: nothing runs beside this test anyway")
    other, leave = _start(folder, serial=False)
    assert not other.wait(0.5)
    leave.set()


class _Terminal:
    """What FirstFailures writes to, recorded."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def _report(outcome: str, text: str) -> pytest.TestReport:
    return pytest.TestReport("t.py::test_x", ("t.py", 1, "test_x"), {}, outcome, text, "call")


def test_why_a_rerun_test_failed_the_first_time_is_printed_at_the_end() -> None:
    plugin = FirstFailures()
    long = "\n".join(f"line {i}" for i in range(100)) + "\nE   AssertionError: lease expired"
    plugin.pytest_runtest_logreport(_report("rerun", long))
    plugin.pytest_runtest_logreport(_report("passed", ""))  # the rerun that passed
    terminal = _Terminal()
    plugin.pytest_terminal_summary(terminal)  # type: ignore[arg-type]
    assert terminal.lines[0] == "== why each rerun test failed the first time"
    text = terminal.lines[1].splitlines()
    assert text[0] == "t.py::test_x (call):" and text[-1] == "E   AssertionError: lease expired"
    assert len(text) == 1 + RERUN_LINES  # the end of the report, where the assertion is
    quiet = _Terminal()
    FirstFailures().pytest_terminal_summary(quiet)  # type: ignore[arg-type]
    assert quiet.lines == []
