"""Checking children started before the uploads they check (`FXTUNE_WARM_CHECKERS`).

A check's child is a fresh Python that imports torch: seconds before it reads a byte. So the
service keeps `size` of them started ahead, each already in its sandbox and under its limits,
with its own empty folder bound (`service.check_folder`), warmed up and waiting on stdin
(`tuner.checks.warm`). A check `take`s one, links its files into the child's folder, hands
it the job and waits for it to exit; the child runs that one job only. Each `take` starts a
replacement at once.

Concurrent checks: a check takes a child that is ready if one is, else the one that has been
starting longest (it will be ready before a child started now would), else, when every child
is taken, it starts a cold one of its own. So two uploads at once never share a child; the second
waits for the replacement of the first's child to finish its start.

The children are started by one long-lived thread of the pool: PR_SET_PDEATHSIG, which ends
a child when the service dies, fires when the thread that started the child ends, and the
request threads that take children come and go. `close` kills the waiting children and ends
that thread, which takes any child still running with it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Literal

from service.check_folder import CheckFolder
from tuner.checks.warm import READY, job_line
from tuner.host.sandbox import bounded_lines

log = logging.getLogger("fxtune.service")

MAX_BACKOFF_S = 60.0  # between starts after children that died before they were ready
Spawn = Callable[[], tuple[subprocess.Popen[str], CheckFolder]]
Readiness = Literal["ready", "ended", "starting"]


class WarmChild:
    """One pre-started checking child: its process, its folder, whether it is ready."""

    def __init__(
        self,
        proc: subprocess.Popen[str],
        folder: CheckFolder,
        on_change: Callable[[WarmChild], None],
    ) -> None:
        self.proc = proc
        self.folder = folder
        self.started_at = time.monotonic()
        self.ready = False
        self.ended = False
        self._settled = threading.Event()
        self._on_change = on_change
        self.reader = threading.Thread(
            target=self._read, name=f"warm-checker-{proc.pid}", daemon=True
        )
        self.reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        """READY once warmed up; whatever follows (the job's own output) is read and dropped.
        A pipe closed under it by `stop` ends it like the end of the output."""
        with contextlib.suppress(OSError, ValueError):
            for line in bounded_lines(self.proc.stdout):
                if not self.ready and line.rstrip("\n") == READY:
                    self.ready = True
                    self._settled.set()
                    self._on_change(self)
        self.ended = True
        self._settled.set()
        self._on_change(self)

    def wait_ready(self, deadline: float) -> Readiness:
        """Block until the child is ready, has ended, or the monotonic `deadline` passed.
        Called before its job is handed over, so `ended` means it died without one."""
        self._settled.wait(max(0.0, deadline - time.monotonic()))
        if self.ended:
            return "ended"
        return "ready" if self.ready else "starting"

    def hand(self, argv: list[str]) -> bool:
        """Give the child its one job; False when it is gone."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(job_line(argv))
            self.proc.stdin.close()
        except (OSError, ValueError):
            return False
        return True

    def stop(self) -> None:
        """Kill it (and its process group) unless it was reaped, reap it, remove its folder."""
        if self.proc.returncode is None:  # once reaped, its number may be another process's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if threading.current_thread() is not self.reader:
            self.reader.join(timeout=5)  # the pipe's end, once the group is gone
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()
        self.folder.remove()


class WarmCheckers:
    """Keeps `size` warm children waiting; `take` hands one to a check and starts another."""

    def __init__(self, size: int, spawn: Spawn) -> None:
        self.size = size
        self._spawn = spawn
        self._waiting: list[WarmChild] = []
        self._cond = threading.Condition()
        self._closed = False
        self._failures = 0
        self._retry_at = 0.0
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._keep_filled, name="fxtune-warm-checkers", daemon=True
        )
        self._thread.start()

    def _keep_filled(self) -> None:
        """The pool's thread: starts children while fewer than `size` wait, until `close`."""
        with self._cond:
            while not self._closed:
                pause = self._retry_at - time.monotonic()
                if len(self._waiting) >= self.size or pause > 0:
                    self._cond.wait(pause if pause > 0 else None)
                    continue
                try:
                    proc, folder = self._spawn()
                except Exception as exc:
                    self._failed(f"cannot start a warm checker: {exc}")
                    continue
                self._waiting.append(WarmChild(proc, folder, self._changed))

    def _failed(self, why: str) -> None:
        """Back off (1 s, 2 s, ... up to a minute) rather than start a failing child in a loop."""
        self._failures += 1
        delay = min(MAX_BACKOFF_S, 2.0 ** (self._failures - 1))
        self._retry_at = time.monotonic() + delay
        level = logging.WARNING if self._failures == 1 else logging.DEBUG
        log.log(level, "%s; checks start their own child meanwhile (retry in %g s)", why, delay)

    def _changed(self, child: WarmChild) -> None:
        """From a child's reader: it is ready, or it ended (waiting children get replaced)."""
        gone = False
        with self._cond:
            if child.ended and child in self._waiting:
                self._waiting.remove(child)
                gone = True
                if not child.ready:
                    code = child.proc.poll()
                    self._failed(f"a warm checker ended while warming up (status {code})")
            elif child.ready:
                self._failures = 0
            self._cond.notify_all()
        if gone:
            child.stop()

    def take(self) -> WarmChild | None:
        """A waiting child for one check (ready ones first), or None when none waits."""
        with self._cond:
            alive = [c for c in self._waiting if not c.ended]
            if not alive:
                return None
            child = next((c for c in alive if c.ready), alive[0])
            self._waiting.remove(child)
            self._cond.notify_all()
            return child

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether a ready child waits within `timeout_s` (for tests and benchmarks)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: any(c.ready and not c.ended for c in self._waiting), timeout_s
            )

    def waiting_pids(self) -> list[int]:
        with self._cond:
            return [c.pid for c in self._waiting]

    def close(self) -> None:
        """Stop the waiting children and the pool's thread; nothing is started after this."""
        with self._cond:
            self._closed = True
            waiting, self._waiting = self._waiting, []
            self._cond.notify_all()
        for child in waiting:
            child.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
