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
    TURNS,
    Recorded,
    Turns,
    check_serial_marks,
    longest_files_first,
    names_serial_mark,
    replay,
    replays,
    summary,
    turn,
    workers_for,
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


def test_files_are_handed_out_slow_then_serial_then_by_their_number_of_tests() -> None:
    items = [
        _Item(Path("a.py")),
        _Item(Path("b.py")),
        _Item(Path("b.py"), {"slow"}),
        _Item(Path("c.py")),
        _Item(Path("c.py")),
        _Item(Path("d.py"), {"slow", "serial"}),
        _Item(Path("e.py"), {"serial"}),
    ]
    longest_files_first(items)  # type: ignore[arg-type]
    assert [(str(i.path), sorted(i.markers)) for i in items] == [
        ("d.py", ["serial", "slow"]),
        ("b.py", []),
        ("b.py", ["slow"]),
        ("e.py", ["serial"]),
        ("c.py", []),
        ("c.py", []),
        ("a.py", []),
    ]


def test_the_serial_run_skips_files_that_do_not_name_the_mark(tmp_path: Path) -> None:
    marked, plain = tmp_path / "test_marked.py", tmp_path / "test_plain.py"
    marked.write_text("import pytest\n\n@pytest.mark.serial\ndef test_x(): pass\n")
    plain.write_text("def test_serial_in_name_only(): pass\n")
    assert names_serial_mark(marked) and not names_serial_mark(plain)
    check_serial_marks([_Item(marked, {"serial"}), _Item(plain)])  # type: ignore[list-item]
    with pytest.raises(pytest.UsageError, match=r"test_plain\.py"):  # marked from elsewhere
        check_serial_marks([_Item(plain, {"serial"})])  # type: ignore[list-item]


def test_auto_starts_one_worker_more_than_the_cores() -> None:
    assert [workers_for(cores) for cores in (1, 2, 16)] == [2, 3, 17]


@pytest.mark.serial
def test_a_serial_test_holds_the_run_s_lock(request: pytest.FixtureRequest) -> None:
    """Through the hook (tests/conftest.py): the lock is held while this test runs, under xdist
    or in one process (`make test`'s serial run)."""
    folder = request.config.stash[TURNS].folder
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


def test_a_replay_runs_files_side_by_side_and_a_serial_test_alone(tmp_path: Path) -> None:
    files = {
        "a.py": [Recorded("a.py", 5.0, True, False)],
        "b.py": [Recorded("b.py", 10.0, False, False)],
    }
    assert replay(files, ["a.py", "b.py"]) == 15.0  # b waits for the serial test
    unserial = {"a.py": [Recorded("a.py", 5.0, False, False)], "b.py": files["b.py"]}
    assert replay(unserial, ["a.py", "b.py"]) == 10.0
    three = {**unserial, "c.py": [Recorded("c.py", 4.0, False, False)]}
    assert replay(three, ["a.py", "b.py", "c.py"]) == 10.0  # c after a, beside b
    timeline = tmp_path / "timeline.jsonl"
    lines = [
        {"test": "b.py::t", "serial": False, "slow": True, "asked": 0, "got": 0, "ended": 10},
        {"test": "a.py::t", "serial": True, "slow": False, "asked": 1, "got": 10, "ended": 15},
    ]
    timeline.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert replays(timeline) == (
        "replayed: 15 s in the recorded order, 15 s longest files first, 10 s with no serial test"
    )
