"""The load sample behind compile estimates: other work on the cores, read from /proc/stat."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tuner.tuning_fixtures import busy_cores
from tuner.host import load
from tuner.host.load import CoreLoad, sample_load, threads_beside


def test_slowdown_is_the_fair_share_of_the_cores() -> None:
    assert CoreLoad(2).slowdown == 1.0
    assert CoreLoad(2, busy=2.0).slowdown == pytest.approx(2.0)
    assert CoreLoad(4, busy=1.0).slowdown == pytest.approx(1.25)
    assert CoreLoad(2, busy=1.0).describe() == "1.0 of 2 cores busy with other work"


def test_an_unreadable_proc_stat_reads_as_a_quiet_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(load, "STAT", tmp_path / "missing")
    assert sample_load(0.01) == CoreLoad(len(os.sched_getaffinity(0)))


@pytest.mark.serial  # it loads every core
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_busy_processes_on_every_core_are_seen() -> None:
    with busy_cores(10.0) as cores:
        seen = sample_load(0.5)
    assert seen.busy >= 0.7 * cores, seen
    assert seen.slowdown >= 1.7, seen


def test_a_child_s_slowdown_is_one_over_the_core_share_it_got_never_above_the_fair_share() -> None:
    assert CoreLoad(2, busy=2.0).child_slowdown == 1.0  # nothing measured: a whole core
    assert CoreLoad(2, busy=2.0, child_share=0.5).child_slowdown == pytest.approx(2.0)
    assert CoreLoad(2, busy=2.0, child_share=0.8).child_slowdown == pytest.approx(1.25)
    assert CoreLoad(2, busy=1.0, child_share=0.1).child_slowdown == pytest.approx(1.5)


def test_a_child_is_started_to_measure_only_where_the_cores_are_shared(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[float] = []
    monkeypatch.setattr(load, "child_core_share", lambda: calls.append(0.4) or 0.4)
    seen = sample_load(0.2)
    assert (seen.child_share, len(calls)) == ((0.4, 1) if seen.shared else (1.0, 0)), seen


@pytest.mark.serial
@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="reads Linux's /proc/stat")
def test_a_child_of_its_own_session_beside_other_sessions_work_gets_less_than_a_core() -> None:
    """Spinners each in a session of their own on every core: a child of its own session
    gets about its fair share of them (cores / (cores + 1) of a core), below one core. Measured
    here over 0.3 s: 0.50-0.88 (fair share 0.67); a new session's first tenths of a second can
    run ahead of its share."""
    with busy_cores(10.0, own_sessions=True):
        seen = sample_load(0.5)
    assert seen.shared, seen
    assert seen.child_share < 0.95, seen
    assert 1.0 < seen.child_slowdown <= seen.slowdown, seen


def test_threads_beside_other_work_leave_it_its_cores() -> None:
    assert threads_beside(CoreLoad(2), wanted=2) == 2
    assert threads_beside(CoreLoad(2, busy=0.3), wanted=2) == 2  # a little noise keeps both
    assert threads_beside(CoreLoad(2, busy=1.0), wanted=2) == 1
    assert threads_beside(CoreLoad(2, busy=2.0), wanted=2) == 1  # never none
    assert threads_beside(CoreLoad(8, busy=3.0), wanted=8) == 5
    assert threads_beside(CoreLoad(8), wanted=4) == 4  # never more than asked
