"""Deciding with statistics whether a rewritten site is faster than the original (Tuning, step 3).

`gen_mkl_autotuner` in torch/fx/experimental/optimization.py, the method this follows, extracts
each MKLDNN subgraph, times the converted version and then the original (one warm-up call, then
10 calls each, `time.time()` around the loop) and keeps the conversion whenever its total is
lower. Any difference counts as a win: a conversion that changes nothing is kept about half the
time, one slightly slower often, and a burst of load during one of the two loops decides alone.
Here instead:

- baseline and candidate run interleaved, in a random order per round, after a warm-up, so drift
  (frequency scaling, other processes, caches) hits both sides alike instead of one of them;
- each sample repeats the call until it lasts about 2 ms, so timer resolution and per-sample
  overhead do not dominate short ops; CUDA samples use events between synchronizations, CPU
  samples `perf_counter_ns` with the thread count pinned, or, where other work holds the cores
  and the timing runs on one thread, this process's CPU time (`Clock`);
- the result is the ratio with a confidence interval (`tuner.measure.summary`), sampling stops
  when that interval is narrow or the budget ends, and a candidate counts as faster only when
  the whole interval clears 1 + epsilon (`tuner.measure.verdicts`);
- the raw samples are kept, so a decision can be re-examined later;
- where a variant runs on a thread pool of its own (OpenVINO, ONNX Runtime), whose threads keep
  spinning after a call and slow whatever runs next, each sample is a block of consecutive
  calls after a pause and an untimed lead-in call (`Blocks`): timed as single calls,
  AOTInductor on bert_mini read 0.66x eager beside the runtimes; without the pause, ONNX
  Runtime against a second session of itself read 0.97x [0.85, 1.19].

One round loop (`run_rounds`) does this wherever it runs. What differs between one process and
ranks in lockstep is a `Sampler`: how one sample is taken, which figure of a round every
participant acts on, and whose clock ends the budget (`LocalSampler` here;
`tuner.distributed.lockstep.LockstepSampler` for ranks).

`tuner.measure.equivalence.check_outputs` comes first: a candidate that is fast but wrong is
never timed.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from tuner.contract.device import Device
from tuner.contract.errors import DeviceUnavailableError, InputError
from tuner.measure.summary import relative_width, summarize
from tuner.measure.verdicts import Comparison

MIN_SAMPLE_S = 2e-3

Timer = Callable[[Callable[[], Any], int], float]
# What a CPU sample measures. "wall": elapsed time, the speed a user sees. "cpu": the CPU time
# this process spent, which other processes on the cores do not stretch: beside two busy
# processes on two cores, paired calls of ResNet-18 on one thread differed by 21 % (log sd)
# by the wall clock and 3.0 % by CPU time, medians 170 and 128 ms (quiet: 2.0 % and 2.6 %, 126
# and 128 ms; `python -m bench.clock_noise`).
# It stands for speed only where the work runs on one thread and never waits (an op that
# sleeps or blocks costs no CPU time), so it is chosen only for a loaded machine timed on one
# thread (`timing_clock`), and refused with more.
Clock = Literal["wall", "cpu"]


@contextmanager
def fixed_threads(n: int | None = None) -> Iterator[int]:
    """Pin torch's intra-op thread count (default: the current one) and restore it afterwards.

    A pass that changes the op mix must not also get a different thread count by accident, and
    nothing timed should be able to change it halfway through.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(n if n is not None else before)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------- timing


def _timed_loop(fn: Callable[[], Any], inner: int, clock_ns: Callable[[], int]) -> float:
    """Seconds per call on `clock_ns`, the garbage collector held off while timing."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = clock_ns()
        for _ in range(inner):
            fn()
        end = clock_ns()
    finally:
        if gc_was_enabled:
            gc.enable()
    return (end - start) / 1e9 / inner


def cpu_timer(fn: Callable[[], Any], inner: int) -> float:
    """Wall-clock seconds per call."""
    return _timed_loop(fn, inner, time.perf_counter_ns)


def process_cpu_timer(fn: Callable[[], Any], inner: int) -> float:
    """CPU seconds of this process per call (every thread of it: work a call hands to another
    thread counts)."""
    return _timed_loop(fn, inner, time.process_time_ns)


# The coarsest step of this process's CPU clock that can still time a sample of MIN_SAMPLE_S.
# Where a CPU-time limit is set (RLIMIT_CPU: `ulimit -t`, a worker's limits once), Linux
# reads the process clock from tick-based accounting: it moved in 4 ms steps here, so a 2 ms
# sample read 0 or 4 ms, and a worker beside other work measured eval dropouts whose removal
# is a 7x win as 1.00x [0.997, 1.006].
FINE_CLOCK_NS = 50_000


@functools.cache
def process_clock_step_ns(spin_s: float = 0.05) -> int | None:
    """The median step of this process's CPU clock while spinning `spin_s` of wall time (None:
    it never moved). The median, not the smallest: under a CPU-time limit the clock moves on
    ticks and also at each context switch, so beside other work a few steps are small. Once per
    process: the limit that coarsens it is set at exec."""
    steps: list[int] = []
    last = time.process_time_ns()
    end = time.perf_counter() + spin_s
    while time.perf_counter() < end:
        now = time.process_time_ns()
        if now != last:
            steps.append(now - last)
            last = now
    return statistics.median_low(steps) if steps else None


def process_clock_is_fine() -> bool:
    """Whether this process's CPU clock can time samples (see FINE_CLOCK_NS)."""
    step = process_clock_step_ns()
    return step is not None and step <= FINE_CLOCK_NS


def timing_clock(device: Device, threads: int, shared: bool) -> Clock:
    """CPU time on a CPU timed on one thread while other work holds the cores (`shared`), where
    this process's CPU clock is fine-grained; else the wall clock."""
    if device.kind == "cpu" and threads == 1 and shared:
        return "cpu" if process_clock_is_fine() else "wall"
    return "wall"


def _cuda_timer() -> Timer:
    """Events measure device time of the queued work; synchronizing first empties the queue."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)

    def timer(fn: Callable[[], Any], inner: int) -> float:
        torch.cuda.synchronize()
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / inner

    return timer


TimingSetup = tuple[Timer, AbstractContextManager[Any], int | None]


def _cpu_setup(device: Device, threads: int | None, clock: Clock) -> TimingSetup:
    count = threads if threads is not None else torch.get_num_threads()
    if clock == "cpu" and count != 1:
        raise ValueError(f"CPU time stands for speed on one thread only, not on {count}")
    timer = process_cpu_timer if clock == "cpu" else cpu_timer
    return timer, fixed_threads(count), count


def _cuda_setup(device: Device, threads: int | None, clock: Clock) -> TimingSetup:
    if clock != "wall":
        raise ValueError("CUDA work is timed by events, not by this process's CPU time")
    ctx = torch.cuda.device(device.index) if device.index is not None else nullcontext()
    return _cuda_timer(), ctx, None


# Per device kind: the timer, the context to time in, and the pinned thread count (CPU only).
# A kind of tuner.contract.device.KINDS missing here cannot be timed (refused before anything runs).
TIMING_SETUPS: dict[str, Callable[[Device, int | None, Clock], TimingSetup]] = {
    "cpu": _cpu_setup,
    "cuda": _cuda_setup,
}


def require_timing(device: Device) -> Device:
    """The device, if it is here and fxtune can time on it; checked before a run starts."""
    device.require_available()
    if device.kind not in TIMING_SETUPS:
        raise DeviceUnavailableError(
            f"timing on {device.kind!r} is not supported (fxtune times on "
            f"{', '.join(TIMING_SETUPS)})"
        )
    return device


def _timing_setup(device: Device, threads: int | None, clock: Clock = "wall") -> TimingSetup:
    return TIMING_SETUPS[device.kind](require_timing(device), threads, clock)


# ---------------------------------------------------------------------------- the round loop


class Sampler(Protocol):
    """Where the round loop runs: the only things that differ between one process and ranks."""

    def line_up(self) -> None:
        """Wait until every participant is ready to sample (nothing to wait for in one
        process). Kept apart from `sample` so that waiting is never timed as calling."""
        ...

    def sample(self, fn: Callable[[], Any], inner: int) -> float:
        """Seconds per call of `inner` calls of `fn` (after `line_up`)."""
        ...

    def agree(self, values: Sequence[float]) -> list[float]:
        """The figures every participant acts on, from this one's (its samples, a round's
        length): what stopping, calibration and the reported samples use."""
        ...

    def time_left(self, deadline: float) -> float:
        """Seconds to `deadline` on the clock that ends the budget for every participant."""
        ...


@dataclass(frozen=True)
class LocalSampler:
    """One process: its own timer, its own figures, its own clock."""

    timer: Timer

    def line_up(self) -> None:
        return None

    def sample(self, fn: Callable[[], Any], inner: int) -> float:
        return self.timer(fn, inner)

    def agree(self, values: Sequence[float]) -> list[float]:
        return list(values)

    def time_left(self, deadline: float) -> float:
        return deadline - time.perf_counter()


@dataclass(frozen=True)
class Blocks:
    """How one sample is taken: a pause of `settle_s` first where another variant ran last (the
    pools it left spinning go to sleep: a runtime's, and torch's own), then `lead_in` untimed
    calls of the variant (caches, its own pool woken), then at least `min_calls` timed calls
    in a row, as far as a round's share of the budget allows. `SINGLE` (the default) is none
    of these."""

    lead_in: int = 0
    min_calls: int = 1
    settle_s: float = 0.0

    def pause_after(self, variant: int | None, before: int) -> float:
        """Seconds to wait between a block of `variant` (None: nothing ran yet) and one of
        `before`."""
        return 0.0 if variant is None or variant == before else self.settle_s

    def pauses_per_round(self, variants: int) -> float:
        """Seconds of pauses one round is planned with."""
        return self.settle_s * variants


SINGLE = Blocks()
# For comparisons where a side keeps its own thread pool (`tuner.backends.registry.
# OWN_THREAD_POOL`): a pause, a lead-in call and blocks of ten. ONNX Runtime's workers spin
# for 30-80 ms after a run (measured on 2 cores: eager's next 10 calls took 2.1x as long right
# after, 1.0x after 0.1 s), longer than a lead-in call of a millisecond model lasts; and
# torch's own pool spins after eager's calls: ONNX Runtime on the CNN example read 4.35x
# [3.64, 5.45] over eager with a pause after its own blocks only, 7.45x [7.29, 7.92] with one
# after eager's too (7-8x in separate processes).
POOLED = Blocks(lead_in=1, min_calls=10, settle_s=0.1)
# A call this long is a sample of its own, calibrated from one loop (`_per_call_s`), and needs
# no lead-in after the pause (`_calibrate`): OpenVINO on distilbert at batch 32 (0.25 s a call,
# one thread), four interleaved comparisons of 15 s each way: over eager 1.21x [1.19, 1.24]
# and 1.21x [1.16, 1.23] with a lead-in, 1.23x [1.19, 1.29] and 1.22x [1.20, 1.24] without;
# against a second session of itself 1.006x and 1.007x with, 1.002x and 1.001x without.
LONG_CALL_S = 0.1


@dataclass(frozen=True)
class RoundRules:
    """When rounds start, how long samples are, and when sampling stops (`run_rounds`)."""

    budget_s: float = 2.0
    warmup: int = 3
    min_rounds: int = 8
    max_rounds: int = 200
    target_rel_ci: float = 0.02
    confidence: float = 0.95
    seed: int = 0
    min_sample_s: float = MIN_SAMPLE_S
    blocks: Blocks = SINGLE


TARGET_CI_ENV = "FXTUNE_TIMING_TARGET_CI"
MAX_ROUNDS_ENV = "FXTUNE_TIMING_MAX_ROUNDS"


@dataclass(frozen=True)
class StopSettings:
    """When a comparison that names neither stops sampling, in this process: once its
    interval is within `target_rel_ci` of the estimate, or at `max_rounds`. Wider and fewer
    tune sooner and tell fewer small differences from noise; the test suite runs with 15 % and
    20 (tests/run_settings.py), `make bench` and users with `RoundRules`' defaults."""

    target_rel_ci: float = RoundRules.target_rel_ci
    max_rounds: int = RoundRules.max_rounds

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> StopSettings:
        target = environ.get(TARGET_CI_ENV, cls.target_rel_ci)
        rounds = environ.get(MAX_ROUNDS_ENV, cls.max_rounds)
        try:
            settings = cls(float(target), int(rounds))
            valid = 0 <= settings.target_rel_ci < 1 and settings.max_rounds >= 1
        except ValueError:
            valid = False
        if not valid:
            raise InputError(
                f"{TARGET_CI_ENV} must be a number in [0, 1) and {MAX_ROUNDS_ENV} a whole number "
                f"of at least 1 (got {target!r} and {rounds!r})"
            )
        return settings


@functools.cache
def stop_settings() -> StopSettings:
    """Read from the environment once, on first use."""
    return StopSettings.from_environ(os.environ)


@dataclass
class Rounds:
    """Seconds per call of each variant per round: `samples` are the agreed figures (what
    counts), `own` this participant's; equal in one process."""

    samples: list[list[float]]
    own: list[list[float]]
    inner: int
    stopped: str

    @property
    def count(self) -> int:
        return len(self.samples[0]) if self.samples else 0


def _per_call_s(sampler: Sampler, fn: Callable[[], Any], target_s: float) -> float:
    """Seconds per call, from loops long enough (target_s / 5) that the timer's grain vanishes.

    The least of three loops: a preempted calibration would shrink every later sample. Loops
    are sized by the wall clock as well as the timer's: rounds and budgets are wall time, and a
    clock that barely moves (CPU time of a call that waits) must not grow them without end.
    """

    def once(n: int) -> float:
        sampler.line_up()
        started = time.perf_counter()
        timed = sampler.sample(fn, n)
        return max(sampler.agree([timed, (time.perf_counter() - started) / n]))

    n = 1
    while True:
        per_call = once(n)
        if n == 1 and per_call >= LONG_CALL_S:  # a sample many times over: inner is 1
            return per_call
        if per_call * n >= target_s / 5 or n >= 1 << 20:
            return min([per_call, once(n), once(n)])
        n *= 10


def _calibrate(
    sampler: Sampler,
    variants: Sequence[Callable[[], Any]],
    min_sample_s: float,
    round_cap_s: float,
    blocks: Blocks = SINGLE,
) -> tuple[int, float, int]:
    """Calls per sample (every variant alike), the expected length of one round, and the
    lead-in calls before each sample.

    The fastest variant sets `inner` so that its samples last min_sample_s (and at least
    `blocks.min_calls`); the cap keeps a much slower one from making one round eat the budget.
    No lead-in where every variant's call lasts `LONG_CALL_S` or more: the pause before a
    sample outlasts the pools' spinning, and a lead-in would double each round's calls.
    """
    per_call = []
    for v, fn in enumerate(variants):
        previous = v - 1 if v else len(variants) - 1  # the warm-up ended with the last variant
        time.sleep(blocks.pause_after(previous, v))
        per_call.append(_per_call_s(sampler, fn, min_sample_s))
    inner, round_s, lead_in = planned_round(per_call, min_sample_s, blocks, round_cap_s)
    return inner, round_s, lead_in


def planned_round(
    per_call: Sequence[float],
    min_sample_s: float = MIN_SAMPLE_S,
    blocks: Blocks = SINGLE,
    round_cap_s: float = math.inf,
) -> tuple[int, float, int]:
    """Calls per sample, the seconds of one round and the lead-in calls, for variants whose
    calls take `per_call` seconds (`_calibrate`; a budget plans with it before timing)."""
    lead_in = 0 if min(per_call) >= LONG_CALL_S else blocks.lead_in
    pauses = blocks.pauses_per_round(len(per_call))
    ideal = max(math.ceil(min_sample_s / max(min(per_call), 1e-9)), blocks.min_calls)
    inner = ideal
    if math.isfinite(round_cap_s):
        inner = max(1, min(ideal, math.floor(round_cap_s / max(sum(per_call), 1e-9)) - lead_in))
    return inner, (inner + lead_in) * sum(per_call) + pauses, lead_in


def _fit_rounds(
    inner: int,
    round_s: float,
    left_s: float,
    rounds_left: int,
    lead_in: int = 0,
    pauses_s: float = 0.0,
) -> tuple[int, float]:
    """Fewer calls per sample when rounds run longer than calibrated (a machine that got busy).

    Samples are seconds per call and each ratio pairs samples of one round, so `inner` may
    change between rounds; reaching min_rounds matters more than 2 ms samples (or long
    blocks: the lead-in call still absorbs what the variant before left behind).
    """
    allowed = left_s / max(rounds_left, 1)
    if round_s <= allowed or inner == 1:
        return inner, round_s
    per_call = max(round_s - pauses_s, 1e-9) / (inner + lead_in)
    smaller = max(1, math.floor(max(allowed - pauses_s, 0.0) / per_call) - lead_in)
    return smaller, per_call * (smaller + lead_in) + pauses_s


def _warm_up(
    sampler: Sampler, variants: Sequence[Callable[[], Any]], calls: int, until: float
) -> None:
    """First calls pay for allocation, lazy init and autotuning: not the steady state. Each is
    a sample of one call, discarded (on CUDA the timer synchronizes around it)."""
    for i in range(max(calls, 1)):
        if i > 0 and sampler.time_left(until) <= 0:
            break
        for fn in variants:
            sampler.line_up()
            sampler.sample(fn, 1)


def run_rounds(
    variants: Sequence[Callable[[], Any]], sampler: Sampler, rules: RoundRules
) -> Rounds:
    """Interleaved rounds of every variant, in a random order per round, after warm-up.

    The budget covers everything (warm-up and calibration included, though each variant is
    called at least once): a round starts only when the last one's length still fits, and
    rounds are shortened when they run longer than calibrated so that min_rounds still fit.
    With two variants (baseline, candidate) it stops with "converged" once the speedup's
    interval is within target_rel_ci of the estimate (after min_rounds), else "budget" or
    "max_rounds". Every decision here reads agreed figures only, so participants sharing a
    `Sampler` (ranks) take the same path.
    """
    r = rules
    deadline = time.perf_counter() + r.budget_s
    order = random.Random(r.seed)
    own: list[list[float]] = [[] for _ in variants]
    agreed: list[list[float]] = [[] for _ in variants]
    stopped = "max_rounds"
    _warm_up(sampler, variants, r.warmup, time.perf_counter() + r.budget_s / 4)
    round_cap = r.budget_s / (2 * max(r.min_rounds, 1))
    inner, round_s, lead_in = _calibrate(sampler, variants, r.min_sample_s, round_cap, r.blocks)
    last: int | None = len(variants) - 1  # calibration ran the variants in order
    while len(agreed[0]) < r.max_rounds:
        if sampler.time_left(deadline) < round_s:
            stopped = "budget"
            break
        started = time.perf_counter()
        times = [0.0] * len(variants)
        for v in order.sample(range(len(variants)), len(variants)):
            time.sleep(r.blocks.pause_after(last, v))
            last = v
            if lead_in:
                sampler.line_up()
                sampler.sample(variants[v], lead_in)  # untimed: what the last variant left
            sampler.line_up()
            times[v] = sampler.sample(variants[v], inner)
        *figures, round_s = sampler.agree([*times, time.perf_counter() - started])
        for v, (mine, counted) in enumerate(zip(times, figures, strict=True)):
            own[v].append(mine)
            agreed[v].append(counted)
        done = len(agreed[0])
        if done >= r.min_rounds:
            if len(variants) == 2:
                s = summarize(agreed[0], agreed[1], r.confidence)
                if relative_width(s) <= r.target_rel_ci:
                    stopped = "converged"
                    break
        else:
            left = sampler.time_left(deadline)
            pauses = r.blocks.pauses_per_round(len(variants))
            inner, round_s = _fit_rounds(inner, round_s, left, r.min_rounds - done, lead_in, pauses)
    return Rounds(agreed, own, inner, stopped)


@dataclass(frozen=True)
class Together:
    """Samples of several variants taken in the same rounds: any two of them compare as paired
    samples (`comparison`), as one A/B comparison of the two would. Two candidates each timed
    against the original in a comparison of its own do not compare so: the original's speed
    drifts between comparisons by more than one interval shows (`tuner.tuning.choose.
    CROSS_DRIFT`)."""

    rounds: Rounds
    confidence: float
    device: str
    threads: int | None
    clock: Clock

    def comparison(self, base: int, cand: int) -> Comparison:
        """Variant `cand` against variant `base` (speedup above 1: `cand` is faster)."""
        return Comparison.from_samples(
            self.rounds.samples[base],
            self.rounds.samples[cand],
            self.rounds.stopped,
            inner=self.rounds.inner,
            confidence=self.confidence,
            device=self.device,
            threads=self.threads,
            clock=self.clock,
        )


def compare_together(
    variants: Sequence[Callable[[], Any]],
    *,
    device: Device | str = "cpu",
    budget_s: float = 2.0,
    warmup: int = 3,
    min_rounds: int = 8,
    max_rounds: int | None = None,
    target_rel_ci: float | None = None,
    confidence: float = 0.95,
    seed: int = 0,
    min_sample_s: float = MIN_SAMPLE_S,
    threads: int | None = None,
    clock: Clock = "wall",
    blocks: Blocks = SINGLE,
) -> Together:
    """Interleaved timing of every variant on this process (`run_rounds` with this device's
    timer, on `clock`; the budget is wall time either way). Unnamed, `max_rounds` and
    `target_rel_ci` are this process's `stop_settings()` (the interval target stops two
    variants only). `blocks`: `POOLED` where a variant runs on a thread pool of its own."""
    stop = stop_settings()
    max_rounds = stop.max_rounds if max_rounds is None else max_rounds
    target_rel_ci = stop.target_rel_ci if target_rel_ci is None else target_rel_ci
    device = Device.parse(device)
    timer, timing_ctx, pinned = _timing_setup(device, threads, clock)
    rules = RoundRules(
        budget_s,
        warmup,
        min_rounds,
        max_rounds,
        target_rel_ci,
        confidence,
        seed,
        min_sample_s,
        blocks,
    )
    with timing_ctx, torch.inference_mode():
        rounds = run_rounds(list(variants), LocalSampler(timer), rules)
    return Together(rounds, confidence, str(device), pinned, clock)


def compare(
    baseline: Callable[[], Any], candidate: Callable[[], Any], **options: Any
) -> Comparison:
    """Interleaved A/B timing: `compare_together` of the two (`options` are its keywords),
    stopped once the speedup's interval is within `target_rel_ci` of it.

    With fewer rounds than the confidence level needs (6 at 95 %), the interval is (0, inf)
    and the verdict 'within noise'.
    """
    return compare_together([baseline, candidate], **options).comparison(0, 1)


def quick_per_call_s(fn: Callable[[], Any], repeats: int = 3) -> float:
    """The least of a few timed calls after one warm-up: a bound, not an A/B figure.

    The least, because a call can only be slowed by the machine, never sped up.
    """
    with torch.inference_mode():
        fn()
        return min(cpu_timer(fn, 1) for _ in range(repeats))


# Calls are measured again while the least so far keeps falling by more than this, for up to
# STEADY_SPAN_S: a run's first calls share the cores with its starting children (a sandboxed
# tune of the dynamic recommendation model read 169 ms a call at first, 1.1 ms a second later).
STEADY_AGREE = 1.25
STEADY_SPAN_S = 2.0


def steady_per_call_s(fn: Callable[[], Any]) -> float:
    """`quick_per_call_s`, taken again until two agree within `STEADY_AGREE` or
    `STEADY_SPAN_S` has passed: the original's call time that bounds a run's checks and
    timings must not be a moment of contention."""
    started = time.perf_counter()
    best = quick_per_call_s(fn)
    while time.perf_counter() - started < STEADY_SPAN_S:
        again = quick_per_call_s(fn)
        if again * STEADY_AGREE >= best:
            return min(best, again)
        best = again
    return best
