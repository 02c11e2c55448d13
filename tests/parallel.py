"""How the suite shares a machine between pytest-xdist workers (`-n auto --dist loadfile`).

Each file runs on one worker, so a module's fixtures (compiled packages, tuned outcomes) are
built once. `-n auto` starts one worker more than the cores (`workers_for`): summed over a run,
a third of the tests' time is spent waiting on a service, a child or a sleep, and with a worker
per core the 2 cores were idle 17 % of the run; with one more, 6 % (most of it in the serial
run, below, which leaves one core idle). Rules on top, applied by tests/conftest.py:

- Files are handed out longest first, as far as collection can tell: files with `slow` tests
  before the others, within each those with `serial` tests first, then by number of tests,
  most first. A long file that started last would leave one worker running alone at the end.
  Replaying eight recorded whole runs (`replay`), this order ended 6 to 51 s sooner than slow
  files first in collection order (mean 30 s); the model came within 0 to 36 s of ten runs'
  real lengths (median 10 s).
- A test marked `serial` runs with no other test beside it: it asserts a speed verdict or a
  tight wall-clock limit (a timeout of a second), which a compile on another core would make
  flaky. A tuning budget, which must hold with other work on the cores, is asserted beside the
  other tests (tests/tuner/tuning/test_budget.py). `make test` runs the serial tests in a run of
  their own after the others (`-m "not serial"`, then `-n 0 -m serial`: one process, no
  worker to start): in one run, a serial test waited for the other workers' current tests to
  end (up to 33 s, with an end-to-end test among them) while they started nothing new. That
  run imports only the files that name the mark (`names_serial_mark`; `check_serial_marks`
  fails a run where a serial test's file does not). Within one run, as plain `pytest` runs them:
  every test holds a shared lock from its setup to its teardown (so a module fixture built for it
  is covered); a serial test holds it exclusively. A turnstile taken before the shared lock keeps
  a waiting serial test from being starved by the other workers' stream of tests. A worker keeps
  the exclusive lock from one serial test to the next when they follow each other in its queue:
  the others wait once for the run, not once per test (each wait lasts until their current test
  ends).

`FXTUNE_TEST_TIMELINE=FILE` appends one JSON line per test (worker, test, serial, slow, when it
asked for its turn, got it and ended): where the suite's wall time goes, and how long workers
waited. `python -m tests.parallel FILE --replay` replays it in other orders (`replay`).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import itertools
import json
import os
import resource
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def workers_for(cores: int) -> int:
    """One worker more than cores: a third of a test's time, summed over the suite, is spent
    waiting on a service, a child or a sleep, which the extra worker fills."""
    return cores + 1


SERIAL_RUNS = ("serial", "serial and not slow")  # the Makefile's second runs' `-m`
SERIAL_MARK = "mark.serial"


def names_serial_mark(path: Path) -> bool:
    """Whether a test file says `mark.serial`: one that does not holds no serial test (every
    serial test is marked in its own file; `check_serial_marks` fails the run otherwise), so
    the serial run need not import it (13 of the suite's files: a collection of 5 s of CPU,
    not 12)."""
    return SERIAL_MARK in path.read_text(encoding="utf-8")


def check_serial_marks(items: list[pytest.Item]) -> None:
    """Fail the run when a serial test's file does not say `mark.serial` (a mark applied from
    elsewhere): the serial run would not collect it, and the other run leaves it out."""
    files = {i.path for i in items if i.get_closest_marker("serial")}
    hidden = sorted(str(path) for path in files if not names_serial_mark(path))
    if hidden:
        raise pytest.UsageError(f"serial tests marked outside their files: {hidden}")


def longest_files_first(items: list[pytest.Item]) -> None:
    """Reorder in place by file: those with a `slow` test first; within each group those with a
    `serial` test first, then by number of tests (most first); a file's tests keep their order."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    serial = {item.path for item in items if item.get_closest_marker("serial") is not None}
    count = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (item.path not in slow, item.path not in serial, -count[item.path]))


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _cpu_s() -> float:
    """CPU seconds of this worker and of the children it has reaped: a test whose CPU time is
    far below its wall time waits (on a service, a sleep), one near it computes."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


ROOM, TURNSTILE = "fxtune-tests.lock", "fxtune-tests.turnstile"


def _exclusive(folder: Path) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    stack.enter_context(_locked(folder / TURNSTILE, fcntl.LOCK_EX))
    stack.enter_context(_locked(folder / ROOM, fcntl.LOCK_EX))
    return stack


@contextlib.contextmanager
def turn(folder: Path, serial: bool) -> Iterator[None]:
    """Hold the run's lock in `folder` for one test: exclusively for a serial one."""
    if serial:
        with _exclusive(folder):
            yield
        return
    with contextlib.ExitStack() as stack:
        with _locked(folder / TURNSTILE, fcntl.LOCK_EX):
            stack.enter_context(_locked(folder / ROOM, fcntl.LOCK_SH))
        yield


class Turns:
    """One worker's turns: like `turn`, but a serial test followed by another serial test keeps
    the exclusive lock for it."""

    def __init__(self, folder: Path, timeline: Path | None = None) -> None:
        self.folder = folder
        self.timeline = timeline
        self._held: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def turn(
        self, test: str, serial: bool, next_serial: bool, slow: bool = False
    ) -> Iterator[None]:
        asked = time.time()
        cpu_before = _cpu_s()
        if not serial and self._held is not None:  # never wait on this worker's own lock
            self._held.close()
            self._held = None
        with contextlib.ExitStack() as shared:
            if serial and self._held is None:
                self._held = _exclusive(self.folder)
            elif not serial:
                shared.enter_context(turn(self.folder, serial=False))
            got = time.time()
            try:
                yield
            finally:
                if serial and not next_serial and self._held is not None:
                    self._held.close()
                    self._held = None
        if self.timeline is not None:
            line = {"worker": os.getpid(), "test": test, "serial": serial, "slow": slow}
            line.update(asked=asked, got=got, ended=time.time(), cpu_s=_cpu_s() - cpu_before)
            with self.timeline.open("a") as f:
                f.write(json.dumps(line) + "\n")


TURNS = pytest.StashKey[Turns]()  # this process's, in `config.stash` (tests/conftest.py)


def lock_folder(config: pytest.Config) -> Path:
    """The controller's temp folder, which every worker's own temp folder is inside (xdist
    gives each worker `--basetemp <controller's>/popen-gwN`); outside xdist (`make test`'s serial
    run, `-n 0`), a folder of this run's own, removed when it ends."""
    if hasattr(config, "workerinput"):
        return Path(config.option.basetemp).parent
    folder = Path(tempfile.mkdtemp(prefix="fxtune-turns-"))
    config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
    return folder


def _timeline(timeline: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in timeline.read_text().splitlines() if line.strip()]


def summary(timeline: Path) -> str:
    """Per worker: how long its tests ran and the CPU they used (its own and its reaped
    children's: far below the running time, they waited), how long it waited for its turn (a
    serial test beside it, or its own serial test waiting for the others' current tests), and
    the gaps between its tests; then the serial tests' share."""
    tests = _timeline(timeline)
    if not tests:
        return "no test in the timeline"
    start, end = min(t["asked"] for t in tests), max(t["ended"] for t in tests)
    lines = [f"{len(tests)} tests over {end - start:.0f} s"]
    for worker in sorted({t["worker"] for t in tests}):
        mine = sorted((t for t in tests if t["worker"] == worker), key=lambda t: t["asked"])
        running = sum(t["ended"] - t["got"] for t in mine)
        cpu = sum(t.get("cpu_s", 0.0) for t in mine)
        waiting = sum(t["got"] - t["asked"] for t in mine)
        gaps = sum(max(0.0, b["asked"] - a["ended"]) for a, b in itertools.pairwise(mine))
        lines.append(
            f"worker {worker}: {len(mine)} tests, running {running:.0f} s (CPU {cpu:.0f} s), "
            f"waiting for its turn {waiting:.0f} s, between tests {gaps:.0f} s, idle at the end "
            f"{end - mine[-1]['ended']:.0f} s"
        )
    serial = [t for t in tests if t["serial"]]
    lines.append(f"serial: {len(serial)} tests, {sum(t['ended'] - t['got'] for t in serial):.0f} s")
    return "\n".join(lines)


@dataclass(frozen=True)
class Recorded:
    """One test of a recorded run, as the replay needs it."""

    file: str
    seconds: float
    serial: bool
    slow: bool


def recorded_files(timeline: Path) -> dict[str, list[Recorded]]:
    """The run's files in the order their first tests asked for a turn (near the order xdist
    handed them out, which it does a file ahead of each worker), each with its tests in order."""
    files: dict[str, list[Recorded]] = {}
    for t in sorted(_timeline(timeline), key=lambda t: t["asked"]):
        name = t["test"].split("::")[0]
        test = Recorded(name, t["ended"] - t["got"], t["serial"], t.get("slow", False))
        files.setdefault(name, []).append(test)
    return files


def replay(files: dict[str, list[Recorded]], order: list[str], workers: int = 2) -> float:
    """How long the run would take if its files were handed out in `order`, each test lasting
    what it lasted when recorded: a model of xdist's loadfile (each worker holds its current file
    and the next) and of the serial lock (a serial test starts once the other workers' current
    tests end; they start nothing until it ends; a worker keeps the lock for its next serial
    test). Tests beside each other slow each other down in a real run; the model does not."""
    queue = list(order)
    pending: list[list[Recorded]] = [[] for _ in range(workers)]
    held: list[list[str]] = [[] for _ in range(workers)]

    def take(w: int) -> None:
        if len(held[w]) < 2 and queue:
            held[w].append(queue[0])
            pending[w].extend(files[queue.pop(0)])

    for _ in range(2):  # at the start: a file for each worker, then its next one
        for w in range(workers):
            take(w)
    ready, busy, keeps = [0.0] * workers, [0.0] * workers, [False] * workers
    while any(pending):
        w = min(
            (w for w in range(workers) if pending[w]),
            key=lambda w: (ready[w], not (keeps[w] and pending[w][0].serial)),
        )
        test = pending[w].pop(0)
        start = ready[w]
        if test.serial and not keeps[w]:
            start = max([start] + [busy[o] for o in range(workers) if o != w])
        end = start + test.seconds
        if test.serial:
            for o in range(workers):
                if o != w:
                    ready[o] = max(ready[o], end)
        keeps[w] = test.serial and bool(pending[w]) and pending[w][0].serial
        ready[w] = busy[w] = end
        if held[w] and not any(t.file == held[w][0] for t in pending[w]):
            held[w].pop(0)  # its file is done: it is handed the one after its next
            take(w)
    return max(ready)


class _Marked:
    """A stand-in test item for `longest_files_first`, built from a recorded test."""

    def __init__(self, test: Recorded) -> None:
        self.path = test.file
        self.test = test

    def get_closest_marker(self, name: str) -> bool | None:
        return {"slow": self.test.slow, "serial": self.test.serial}.get(name) or None


def replays(timeline: Path) -> str:
    """The recorded run replayed in its own order, in the suite's order, and without serial
    tests (a bound on what scheduling could still give)."""
    files = recorded_files(timeline)
    items = [_Marked(t) for tests in files.values() for t in tests]
    longest_files_first(items)  # type: ignore[arg-type]
    suite_order = list(dict.fromkeys(item.path for item in items))
    unserial = {
        name: [Recorded(t.file, t.seconds, False, t.slow) for t in tests]
        for name, tests in files.items()
    }
    return (
        f"replayed: {replay(files, list(files)):.0f} s in the recorded order, "
        f"{replay(files, suite_order):.0f} s longest files first, "
        f"{replay(unserial, suite_order):.0f} s with no serial test"
    )


if __name__ == "__main__":  # python -m tests.parallel TIMELINE.jsonl [--replay]
    import sys

    print(summary(Path(sys.argv[1])))
    if "--replay" in sys.argv[2:]:
        print(replays(Path(sys.argv[1])))
