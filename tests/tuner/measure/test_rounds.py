"""One round loop (tuner.measure.timing.run_rounds) for local and lockstep timing.

The samples here come from a script, not a clock, so the two paths can be compared exactly:
given the same samples, local rounds and ranks in lockstep (real gloo ranks) must produce the
same Summary, and in lockstep the slowest rank's samples are the ones that count.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tuner.distributed.lockstep import lockstep_timing
from tuner.distributed.ranks import run_ranks
from tuner.measure.summary import Summary, summarize
from tuner.measure.timing import LocalSampler, RoundRules, Rounds, run_rounds

# Never converges (a width is never negative) and never runs out of budget: a fixed count.
RULES = RoundRules(budget_s=600.0, min_rounds=4, max_rounds=15, target_rel_ci=-1.0, seed=3)


class Variant:
    """A step whose scripted time per call is `base_s`, give or take a repeating wobble."""

    def __init__(self, base_s: float) -> None:
        self.base_s = base_s
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


class Script:
    """A timer that reads samples from a script: the k-th sample of a variant is the same on
    every run and every rank, times `slowdown`."""

    def __init__(self, slowdown: float = 1.0) -> None:
        self.slowdown = slowdown
        self.taken: dict[int, int] = {}

    def __call__(self, fn: Callable[[], Any], inner: int) -> float:
        assert isinstance(fn, Variant)
        for _ in range(inner):
            fn()
        k = self.taken.get(id(fn), 0)
        self.taken[id(fn)] = k + 1
        return fn.base_s * (1 + 0.1 * ((k * 7) % 11) / 11) * self.slowdown


def _variants() -> list[Variant]:
    return [Variant(1e-3), Variant(0.8e-3)]


def _summary(rounds: Rounds) -> Summary:
    return summarize(rounds.samples[0], rounds.samples[1], RULES.confidence)


def _local(slowdown: float) -> Rounds:
    return run_rounds(_variants(), LocalSampler(Script(slowdown)), RULES)


def _lockstep(rank: int, world_size: int) -> tuple[Rounds, list[list[list[float]]]]:
    """Rank r's samples are (r + 1) times the script's: the last rank is the slowest."""
    timing = lockstep_timing(_variants(), RULES, timer=Script(slowdown=rank + 1.0))
    return timing.rounds, timing.per_rank


def test_local_rounds_follow_the_rules() -> None:
    rounds = _local(1.0)
    assert rounds.count == 15 and rounds.stopped == "max_rounds"
    assert rounds.samples == rounds.own
    assert rounds.inner == 3  # 2 ms samples of the faster variant (0.8 ms per call)
    s = _summary(rounds)
    assert s.speedup == pytest.approx(1.25, rel=0.1) and s.low is not None


def test_lockstep_and_local_rounds_give_the_same_summary_from_the_same_samples() -> None:
    results = run_ranks(_lockstep, 2, backend="gloo", collective_timeout_s=60)
    local = {slowdown: _local(slowdown) for slowdown in (1.0, 2.0)}
    # Calls per sample come from the agreed figures, so every rank calls alike; how many is
    # also a wall-clock matter (a descheduled rank), so it is not compared with a local run.
    assert results[0][0].inner == results[1][0].inner
    for rank, (rounds, per_rank) in enumerate(results):
        # What counts on every rank is the slowest rank's samples: rank 1's, run locally.
        assert rounds.samples == local[2.0].samples
        assert _summary(rounds) == _summary(local[2.0])
        assert rounds.stopped == local[2.0].stopped
        assert rounds.own == local[rank + 1.0].own  # each rank keeps its own too
        assert per_rank == [local[1.0].own, local[2.0].own]


class SlowToLineUp(LocalSampler):
    """A participant that waits 30 ms for the others before every sample (a rank whose peer
    is busy): the wait is not the call's time."""

    def line_up(self) -> None:
        time.sleep(0.03)


def test_waiting_to_line_up_is_not_timed_as_calling() -> None:
    waiting = run_rounds(_variants(), SlowToLineUp(Script()), RULES)
    assert waiting.inner == _local(1.0).inner == 3
