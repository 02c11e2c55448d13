"""Timing variants of a distributed step on every rank in lockstep; the slowest rank counts.

A step that contains a collective is as slow as its slowest rank: a rank that finishes its
compute early only waits longer inside the collective. So each round, every rank runs the same
variant at the same time (same random order on every rank, a barrier before each sample), and
the round's figure for a variant is the maximum over ranks of its time per call (an all-reduce
MAX). Every rank then holds the same numbers, so stopping rules computed from them agree
without any further message, and ranks never diverge. Each rank's own times are kept too, for
the per-rank figures in the report. The wall-clock budget is rank 0's (its verdict travels in
the same all-reduce), since clocks on different ranks need not agree.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from tuner.measure.timing import MIN_SAMPLE_S, summarise


@dataclass
class LockstepTiming:
    """Per-variant seconds per call: `slowest[v][i]` is round i's maximum over ranks."""

    slowest: list[list[float]]
    own: list[list[float]]
    inner: int
    rounds: int
    stopped: str
    per_rank: list[list[list[float]]] = field(default_factory=list)


def _all_max(values: Sequence[float]) -> list[float]:
    t = torch.tensor(list(values), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _sample(fn: Callable[[], Any], inner: int) -> float:
    cuda = torch.cuda.is_available() and dist.get_backend() == "nccl"
    dist.barrier()
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter_ns()
    for _ in range(inner):
        fn()
    if cuda:  # NCCL ranks: kernels and collectives finish on the GPU, not when the call returns
        torch.cuda.synchronize()
    return (time.perf_counter_ns() - started) / 1e9 / inner


def lockstep_timing(
    variants: Sequence[Callable[[], Any]],
    *,
    budget_s: float = 5.0,
    warmup: int = 3,
    min_rounds: int = 8,
    max_rounds: int = 200,
    target_rel_ci: float = 0.02,
    confidence: float = 0.95,
    min_sample_s: float = MIN_SAMPLE_S,
    seed: int = 0,
) -> LockstepTiming:
    """Interleaved, barrier-synchronised rounds of every variant on every rank.

    With two variants (baseline, candidate), sampling stops early once the speedup interval
    of the slowest-rank times is within `target_rel_ci`. Every rank must call this with the
    same variants in the same order; it is collective.
    """
    deadline = time.perf_counter() + budget_s
    with torch.inference_mode():
        for fn in variants:
            for _ in range(warmup):
                fn()
        once = _all_max([_sample(fn, 1) for fn in variants])
        inner = max(1, math.ceil(min_sample_s / max(min(once), 1e-9)))
        own: list[list[float]] = [[] for _ in variants]
        slowest: list[list[float]] = [[] for _ in variants]
        stopped = "max_rounds"
        round_s = 0.0
        while len(slowest[0]) < max_rounds:
            over = dist.get_rank() == 0 and time.perf_counter() + round_s > deadline
            stop = _all_max([1.0 if over else 0.0])[0]
            if stop:
                stopped = "budget"
                break
            began = time.perf_counter()
            order = list(range(len(variants)))
            random.Random(seed * 1_000_003 + len(slowest[0])).shuffle(order)
            times = [0.0] * len(variants)
            for v in order:
                times[v] = _sample(variants[v], inner)
            for v, t in enumerate(times):
                own[v].append(t)
            for v, t in enumerate(_all_max(times)):
                slowest[v].append(t)
            round_s = time.perf_counter() - began
            if len(variants) == 2 and len(slowest[0]) >= min_rounds:
                speedup, low, high = summarise(slowest[0], slowest[1], confidence)
                if math.isfinite(high) and (high - low) / speedup <= target_rel_ci:
                    stopped = "converged"
                    break
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, own)
    return LockstepTiming(slowest, own, inner, len(slowest[0]), stopped, gathered)
