"""Timing variants of a distributed step on every rank in lockstep; the slowest rank counts.

A step that contains a collective is as slow as its slowest rank: a rank that finishes its
compute early only waits longer inside the collective. So each round, every rank runs the same
variant at the same time (same random order on every rank, a barrier before each sample), and
the round's figure for a variant is the maximum over ranks of its time per call (an all-reduce
MAX). Every rank then holds the same numbers, so stopping rules computed from them agree
without any further message, and ranks never diverge. Each rank's own times are kept too, for
the per-rank figures in the report. The wall-clock budget is rank 0's (broadcast whenever the
loop asks for the time left), since clocks on different ranks need not agree.

The rounds themselves are `tuner.measure.timing.run_rounds`, the loop every A/B timing uses;
`LockstepSampler` is what differs on ranks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tuner.measure.timing import RoundRules, Rounds, Timer, cpu_timer, run_rounds


def synced_timer(fn: Callable[[], Any], inner: int) -> float:
    """NCCL ranks: kernels and collectives finish on the GPU, not when the call returns."""
    torch.cuda.synchronize()
    started = time.perf_counter_ns()
    for _ in range(inner):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - started) / 1e9 / inner


def rank_timer() -> Timer:
    """The timer for this rank's backend: wall clock, synchronized with the GPU under NCCL."""
    return synced_timer if dist.get_backend() == "nccl" else cpu_timer


@dataclass(frozen=True)
class LockstepSampler:
    """A `tuner.measure.timing.Sampler` for ranks: a barrier before each sample, the slowest
    rank's figures, rank 0's clock. Collective: every rank calls it alike."""

    timer: Timer

    def line_up(self) -> None:
        dist.barrier()

    def sample(self, fn: Callable[[], Any], inner: int) -> float:
        return self.timer(fn, inner)

    def agree(self, values: Sequence[float]) -> list[float]:
        t = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.tolist()

    def time_left(self, deadline: float) -> float:
        t = torch.tensor([deadline - time.perf_counter()], dtype=torch.float64)
        dist.broadcast(t, src=0)
        return float(t.item())


@dataclass
class LockstepTiming:
    """`rounds.samples[v][i]`: round i's maximum over ranks for variant v; `per_rank[r]` is rank
    r's own samples (`rounds.own` there)."""

    rounds: Rounds
    per_rank: list[list[list[float]]] = field(default_factory=list)


def lockstep_timing(
    variants: Sequence[Callable[[], Any]], rules: RoundRules, timer: Timer | None = None
) -> LockstepTiming:
    """`run_rounds` of every variant on every rank in lockstep (collective: every rank must
    call this with the same variants in the same order). `timer`: the rank's own
    (`rank_timer`) unless given."""
    sampler = LockstepSampler(timer if timer is not None else rank_timer())
    with torch.inference_mode():
        rounds = run_rounds(variants, sampler, rules)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, rounds.own)
    return LockstepTiming(rounds, gathered)
