"""The bound on checks running at once: slots, a bounded queue of uploads, results first, and
the slots sized so their memory caps fit (issue 47). Threads stand in for the checks."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from service.check_gate import CheckCapacity, CheckGate, ChecksBusy, check_capacity
from service.core.config import Settings
from tests.service.helpers import wait_for


def gate(slots: int = 1, queue: int = 1, wait_s: float = 5.0) -> CheckGate:
    return CheckGate(CheckCapacity(slots, queue, wait_s, 5.0, 1024, 1024 * slots))


@contextmanager
def held(g: CheckGate, result: bool = False) -> Iterator[threading.Event]:
    """A check holding a slot (in a thread) until the event is set."""
    release, holding = threading.Event(), threading.Event()

    def run() -> None:
        with g.slot(result):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert holding.wait(10)
    try:
        yield release
    finally:
        release.set()
        thread.join(10)


def waiter(g: CheckGate, order: list[str], name: str, result: bool = False) -> threading.Thread:
    def run() -> None:
        try:
            with g.slot(result):
                order.append(name)
        except ChecksBusy:
            order.append(f"{name} busy")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_past_the_slots_and_the_queue_an_upload_is_refused_at_once_with_a_retry_after() -> None:
    g = gate(slots=1, queue=1)
    order: list[str] = []
    with held(g) as release:
        queued = waiter(g, order, "queued")
        wait_for(lambda: g.state().waiting_uploads == 1, 10, "the upload to queue")
        started = time.monotonic()
        with pytest.raises(ChecksBusy) as busy, g.slot():
            pass
        assert time.monotonic() - started < 1
        assert busy.value.retry_after_s >= 1
        assert g.state().running == 1
        release.set()
        queued.join(10)
    assert order == ["queued"]
    assert g.state().running == 0


def test_a_queued_upload_gives_up_after_its_wait() -> None:
    g = gate(slots=1, queue=4, wait_s=0.3)
    with held(g):
        started = time.monotonic()
        with pytest.raises(ChecksBusy, match=r"no check slot came free in 0\.3 s"), g.slot():
            pass
        assert 0.25 < time.monotonic() - started < 5
    assert g.state().waiting_uploads == 0


def test_results_go_ahead_of_waiting_uploads_and_never_meet_a_full_queue() -> None:
    g = gate(slots=1, queue=1)
    order: list[str] = []
    with held(g) as release:
        upload = waiter(g, order, "upload")
        wait_for(lambda: g.state().waiting_uploads == 1, 10, "the upload to queue")
        results = [waiter(g, order, f"result{i}", result=True) for i in range(2)]
        wait_for(lambda: g.state().waiting_results == 2, 10, "the results to queue")
        release.set()
        for t in (upload, *results):
            t.join(10)
    assert order[-1] == "upload" and sorted(order[:2]) == ["result0", "result1"]


def test_no_more_than_the_slots_run_at_once() -> None:
    g = gate(slots=2, queue=20)
    running, peak, lock = 0, 0, threading.Lock()

    def check() -> None:
        nonlocal running, peak
        with g.slot():
            with lock:
                running += 1
                peak = max(peak, running)
            time.sleep(0.02)
            with lock:
                running -= 1

    threads = [threading.Thread(target=check) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak == 2 and g.state().running == 0


def test_the_slots_are_cut_until_their_memory_caps_fit() -> None:
    base = {"analysis_memory_mb": 4096}
    # Half the cores by default, at least one.
    assert check_capacity(Settings(**base), cores=16, memory_mb=10**6).slots == 8
    assert check_capacity(Settings(**base), cores=1, memory_mb=10**6).slots == 1
    # Half of 24 GiB holds three 4 GiB caps, not eight.
    capped = check_capacity(Settings(**base), cores=16, memory_mb=24 * 1024)
    assert (capped.slots, capped.total_mb, capped.queue) == (3, 12 * 1024, 6)
    explicit = Settings(**base, analysis_concurrency=5, analysis_total_memory_mb=9000)
    assert check_capacity(explicit, cores=64, memory_mb=10**6).slots == 2
    # A machine smaller than one cap still checks, one at a time.
    assert check_capacity(Settings(**base), cores=8, memory_mb=2048).slots == 1
    with pytest.raises(ValueError, match="less than one check's cap"):
        Settings(**base, analysis_total_memory_mb=2048)
