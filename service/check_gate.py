"""How many checks of untrusted programs run at once, and how many uploads may wait for one.

Each check is a child with an address-space cap (FXTUNE_ANALYSIS_MEMORY_MB). At most `slots` run
at once, so their caps together stay within FXTUNE_ANALYSIS_TOTAL_MEMORY_MB, and by default
within half the cores. An upload's check waits for a slot in a first-come queue of at most
`queue` for at most `wait_s`; past either it gets `ChecksBusy` (HTTP 503 with Retry-After) and
nothing of the upload is stored. A worker's result goes ahead of waiting uploads and is never
refused for a full queue (a refusal throws away the tuning it carries); it waits up to
`result_wait_s`. Warm children (`service.warm_checkers`) hold no slot while they wait for a job:
they run only fxtune's code, idle, until a check holding a slot takes one.

One gate per service process: several processes sharing a database each have their own.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from service.core.config import Settings

DEFAULT_CHECK_S = 10.0  # the Retry-After estimate before any check has finished
MAX_RETRY_AFTER_S = 600


def machine_cores() -> int:
    return len(os.sched_getaffinity(0))


def physical_memory_mb() -> int:
    return (os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) >> 20


@dataclass(frozen=True)
class CheckCapacity:
    """The numbers the gate keeps, resolved once from the settings and this machine."""

    slots: int
    queue: int
    wait_s: float
    result_wait_s: float
    child_mb: int
    total_mb: int

    def describe(self) -> str:
        return (
            f"at most {self.slots} check(s) at once ({self.child_mb} MiB cap each, "
            f"{self.slots * self.child_mb} of {self.total_mb} MiB), {self.queue} upload(s) "
            f"waiting for at most {self.wait_s:g} s"
        )


def check_capacity(
    settings: Settings, cores: int | None = None, memory_mb: int | None = None
) -> CheckCapacity:
    """Slots: the configured concurrency (default half the cores), lowered until that many caps
    fit in the total (default half the physical memory, at least one cap)."""
    child = settings.analysis_memory_mb
    total = settings.analysis_total_memory_mb
    if total is None:
        total = max((memory_mb or physical_memory_mb()) // 2, child)
    wanted = settings.analysis_concurrency or max(1, (cores or machine_cores()) // 2)
    slots = max(1, min(wanted, total // child))  # total >= child: Settings checks it
    queue = 2 * slots if settings.analysis_queue is None else settings.analysis_queue
    return CheckCapacity(
        slots=slots,
        queue=queue,
        wait_s=settings.analysis_queue_wait_s,
        result_wait_s=settings.analysis_wall_s,
        child_mb=child,
        total_mb=total,
    )


class ChecksBusy(RuntimeError):
    """Every check slot is taken and the queue is full or was waited in too long (HTTP 503)."""

    def __init__(self, detail: str, retry_after_s: int) -> None:
        super().__init__(detail)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class GateState:
    running: int
    waiting_uploads: int
    waiting_results: int
    slots: int
    queue: int


class CheckGate:
    """A counting semaphore with two first-come lines: results, then uploads (bounded)."""

    def __init__(self, capacity: CheckCapacity) -> None:
        self.capacity = capacity
        self._cond = threading.Condition()
        self._running = 0
        self._results: deque[object] = deque()
        self._uploads: deque[object] = deque()
        self._durations: deque[float] = deque(maxlen=16)

    @contextmanager
    def slot(self, result: bool = False) -> Iterator[None]:
        """Hold a slot for one check; raises ChecksBusy where an upload may not wait (more)."""
        self._acquire(result)
        started = time.monotonic()
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._durations.append(time.monotonic() - started)
                self._cond.notify_all()

    def _acquire(self, result: bool) -> None:
        cap = self.capacity
        with self._cond:
            ahead = self._results if result else (self._results or self._uploads)
            if self._running < cap.slots and not ahead:
                self._running += 1
                return
            if not result and len(self._uploads) >= cap.queue:
                raise ChecksBusy(
                    f"the service is running {self._running} check(s) and {len(self._uploads)} "
                    "more uploads wait, its limit: nothing was stored; send it again later",
                    self._retry_after(),
                )
            line, ticket = (self._results if result else self._uploads), object()
            line.append(ticket)
            try:
                got = self._cond.wait_for(
                    lambda: self._running < cap.slots and self._head() is ticket,
                    cap.result_wait_s if result else cap.wait_s,
                )
                if got:
                    self._running += 1
            finally:
                line.remove(ticket)
                self._cond.notify_all()
            if not got:
                waited = cap.result_wait_s if result else cap.wait_s
                raise ChecksBusy(
                    f"no check slot came free in {waited:g} s (at most {cap.slots} run at "
                    "once): nothing was stored; send it again later",
                    self._retry_after(),
                )

    def _head(self) -> object | None:
        line = self._results or self._uploads
        return line[0] if line else None

    def _retry_after(self) -> int:
        """The checks ahead of a new one, at the recent mean time per check, per slot."""
        mean = sum(self._durations) / len(self._durations) if self._durations else DEFAULT_CHECK_S
        ahead = self._running + len(self._results) + len(self._uploads)
        rounds = max(1, math.ceil(ahead / self.capacity.slots))
        return min(MAX_RETRY_AFTER_S, max(1, math.ceil(mean * rounds)))

    def state(self) -> GateState:
        with self._cond:
            cap = self.capacity
            return GateState(
                self._running, len(self._uploads), len(self._results), cap.slots, cap.queue
            )
