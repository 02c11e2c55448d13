"""How the suite shares a machine between pytest-xdist workers (`-n auto --dist loadfile`).

Each file runs on one worker, so a module's fixtures (compiled packages, tuned outcomes) are
built once. Two rules on top, applied by tests/conftest.py:

- Files with `slow` tests are handed out first: a long file that started last would leave one
  worker running alone at the end.
- A test marked `serial` runs with no other test beside it: it asserts a wall-clock limit or a
  speed verdict, which a compile on the other core would make flaky. Every test holds a shared
  lock from its setup to its teardown (so a module fixture built for it is covered); a serial
  test holds it exclusively. A turnstile taken before the shared lock keeps a waiting serial
  test from being starved by the other workers' stream of tests.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

import pytest


def slow_files_first(items: list[pytest.Item]) -> None:
    """Reorder in place: the files holding a `slow` test first, each file's tests in order."""
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


@contextlib.contextmanager
def _locked(path: Path, mode: int) -> Iterator[None]:
    with path.open("a") as f:
        fcntl.flock(f, mode)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def turn(folder: Path, serial: bool) -> Iterator[None]:
    """Hold the run's lock in `folder` for one test: exclusively for a serial one."""
    room, turnstile = folder / "fxtune-tests.lock", folder / "fxtune-tests.turnstile"
    if serial:
        with _locked(turnstile, fcntl.LOCK_EX), _locked(room, fcntl.LOCK_EX):
            yield
        return
    with contextlib.ExitStack() as stack:
        with _locked(turnstile, fcntl.LOCK_EX):
            stack.enter_context(_locked(room, fcntl.LOCK_SH))
        yield


def lock_folder(config: pytest.Config) -> Path | None:
    """The controller's temp folder, which every worker's own temp folder is inside (xdist
    gives each worker `--basetemp <controller's>/popen-gwN`); None outside xdist."""
    if not hasattr(config, "workerinput"):
        return None
    return Path(config.option.basetemp).parent
