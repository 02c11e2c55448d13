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
  samples `perf_counter_ns` with the thread count pinned;
- the result is the ratio with a confidence interval, sampling stops when that interval is narrow
  or the budget ends, and a candidate counts as faster only when the whole interval clears
  1 + epsilon;
- the raw samples are kept, so a decision can be re-examined later.

`check_outputs` comes first: a candidate that is fast but wrong is never timed.
"""

from __future__ import annotations

import copy
import gc
import math
import random
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from tuner.contract.device import Device
from tuner.contract.errors import DeviceUnavailableError
from tuner.host import failures
from tuner.host.torch_compat import pytree
from tuner.measure.summary import Summary, order_rank, summarize

MIN_SAMPLE_S = 2e-3
# How many times the reference's own error (spread, distance from float64) a candidate may add.
NOISE_FACTOR = 3.0
# The float64 copy of a reference is skipped above this size (it needs twice the memory of float32).
MAX_FLOAT64_BYTES = 2 << 30

Timer = Callable[[Callable[[], Any], int], float]


@dataclass
class Comparison:
    """The A/B result. Times are seconds per call; speedup > 1 means the candidate is faster."""

    baseline_s: list[float]
    candidate_s: list[float]
    speedup: float
    ci_low: float
    ci_high: float
    rounds: int
    stopped: str
    inner: int = 1
    confidence: float = 0.95
    device: str = "cpu"
    threads: int | None = None

    @property
    def summary(self) -> Summary:
        """The figures reported for this comparison (`tuner.measure.summary`: one rule)."""
        return summarize(self.baseline_s, self.candidate_s, self.confidence)

    @property
    def baseline_median_s(self) -> float:
        s = self.summary.baseline_s
        return math.nan if s is None else s

    @property
    def candidate_median_s(self) -> float:
        s = self.summary.candidate_s
        return math.nan if s is None else s

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe, from `summary`: an open interval side (too few rounds) becomes None."""
        data = asdict(self)
        s = self.summary
        data.update(
            speedup=s.speedup,
            ci_low=s.low,
            ci_high=s.high,
            baseline_median_s=s.baseline_s,
            candidate_median_s=s.candidate_s,
            dropped_rounds=s.dropped,
        )
        return data


def timing_fields(c: Comparison) -> dict[str, Any]:
    """The summary of an A/B comparison as stored in a config (raw samples go to the report).

    Every config figure (sites, candidates, per size) comes from here, so from `c.summary`.
    """
    s = c.summary
    return {
        "baseline_s": s.baseline_s,
        "candidate_s": s.candidate_s,
        "speedup": s.speedup,
        "ci": s.ci,
        "rounds": s.rounds,
    }


def verdict(c: Comparison, epsilon: float = 0.02) -> str:
    """'faster' only when ci_low > 1 + epsilon; 'slower' when ci_high < 1; else 'within noise'.

    The asymmetry is deliberate: keeping a rewrite needs evidence of a real win, while
    rejecting one needs only evidence that it does not help.
    """
    if c.ci_low > 1 + epsilon:
        return "faster"
    if c.ci_high < 1:
        return "slower"
    return "within noise"


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


def _cpu_timer(fn: Callable[[], Any], inner: int) -> float:
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        end = time.perf_counter_ns()
    finally:
        if gc_was_enabled:
            gc.enable()
    return (end - start) / 1e9 / inner


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


def _cpu_setup(device: Device, threads: int | None) -> TimingSetup:
    count = threads if threads is not None else torch.get_num_threads()
    return _cpu_timer, fixed_threads(count), count


def _cuda_setup(device: Device, threads: int | None) -> TimingSetup:
    ctx = torch.cuda.device(device.index) if device.index is not None else nullcontext()
    return _cuda_timer(), ctx, None


# Per device kind: the timer, the context to time in, and the pinned thread count (CPU only).
# A kind of tuner.contract.device.KINDS missing here cannot be timed (refused before anything runs).
TIMING_SETUPS: dict[str, Callable[[Device, int | None], TimingSetup]] = {
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


def _timing_setup(device: Device, threads: int | None) -> TimingSetup:
    return TIMING_SETUPS[device.kind](require_timing(device), threads)


def _per_call_s(timer: Timer, fn: Callable[[], Any], target_s: float) -> float:
    """Seconds per call, from loops long enough (target_s / 5) that the timer's grain vanishes.

    The least of three loops: a preempted calibration would shrink every later sample.
    """
    n = 1
    while True:
        per_call = timer(fn, n)
        if per_call * n >= target_s / 5 or n >= 1 << 20:
            return min([per_call, timer(fn, n), timer(fn, n)])
        n *= 10


def _calibrate(
    timer: Timer,
    baseline: Callable[[], Any],
    candidate: Callable[[], Any],
    min_sample_s: float,
    round_cap_s: float,
) -> tuple[int, float]:
    """Calls per sample (both sides alike) and the expected length of one round.

    The faster side sets `inner` so that its samples last min_sample_s; the cap keeps a much
    slower side from making one round eat the budget.
    """
    per_base = _per_call_s(timer, baseline, min_sample_s)
    per_cand = _per_call_s(timer, candidate, min_sample_s)
    ideal = math.ceil(min_sample_s / max(min(per_base, per_cand), 1e-9))
    cap = math.floor(round_cap_s / max(per_base + per_cand, 1e-9))
    inner = max(1, min(ideal, cap))
    return inner, inner * (per_base + per_cand)


def _fit_rounds(inner: int, round_s: float, left_s: float, rounds_left: int) -> tuple[int, float]:
    """Fewer calls per sample when rounds run longer than calibrated (a machine that got busy).

    Samples are seconds per call and each ratio pairs samples of one round, so `inner` may
    change between rounds; reaching min_rounds matters more than 2 ms samples.
    """
    allowed = left_s / max(rounds_left, 1)
    if round_s <= allowed or inner == 1:
        return inner, round_s
    smaller = max(1, math.floor(inner * allowed / round_s))
    return smaller, round_s * smaller / inner


def quick_per_call_s(fn: Callable[[], Any], repeats: int = 3) -> float:
    """The least of a few timed calls after one warm-up: a bound, not an A/B figure.

    The least, because a call can only be slowed by the machine, never sped up.
    """
    with torch.inference_mode():
        fn()
        return min(_cpu_timer(fn, 1) for _ in range(repeats))


# ---------------------------------------------------------------------------- statistics


def median_interval(values: Sequence[float], confidence: float) -> tuple[float, float, float]:
    """Median and its distribution-free confidence interval (±inf when n is too small)."""
    if not values:
        return math.nan, -math.inf, math.inf
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    center = float(np.median(ordered))
    k = order_rank(len(ordered), confidence)
    if k == 0:
        return center, -math.inf, math.inf
    return center, float(ordered[k - 1]), float(ordered[len(ordered) - k])


def summarise(
    baseline_s: Sequence[float], candidate_s: Sequence[float], confidence: float
) -> tuple[float, float, float]:
    """Speedup and its interval from paired samples.

    Each round gives one log(t_base / t_cand); the estimate is exp(median) and the interval the
    sign-test interval of that median. Chosen over a t-interval because a shared machine's
    samples are skewed and carry outliers (one preempted sample would widen a t-interval for
    every later round and bias the mean), and over a bootstrap because the order-statistic
    interval has exact coverage for any distribution even at 8 rounds, needs no random seed and
    is cheap enough to re-evaluate after every round for the stopping rule. Logs make the
    statistic symmetric: a 2x win and a 2x loss are equally far from 1.
    """
    ratios = [math.log(b / c) for b, c in zip(baseline_s, candidate_s, strict=True)]
    center, low, high = median_interval(ratios, confidence)
    return math.exp(center), math.exp(low), math.exp(high)


def _relative_width(speedup: float, low: float, high: float) -> float:
    return (high - low) / speedup if math.isfinite(high) and speedup > 0 else math.inf


# ---------------------------------------------------------------------------- A/B timing


def compare(
    baseline: Callable[[], Any],
    candidate: Callable[[], Any],
    *,
    device: Device | str = "cpu",
    budget_s: float = 2.0,
    warmup: int = 3,
    min_rounds: int = 8,
    max_rounds: int = 200,
    target_rel_ci: float = 0.02,
    confidence: float = 0.95,
    seed: int = 0,
    min_sample_s: float = MIN_SAMPLE_S,
    threads: int | None = None,
) -> Comparison:
    """Interleaved A/B timing in random order per round after warm-up.

    The budget covers everything (warm-up and calibration included, though each side is called
    at least once): a round starts only when the last one's length still fits, and rounds are
    shortened when they run longer than calibrated so that min_rounds still fit. Stops with
    "converged" once the speedup's interval is within target_rel_ci of the estimate (after
    min_rounds), else "budget" or "max_rounds". With fewer rounds than the confidence level
    needs (6 at 95 %), the interval is (0, inf) and the verdict 'within noise'.
    """
    device = Device.parse(device)
    timer, timing_ctx, pinned = _timing_setup(device, threads)
    deadline = time.perf_counter() + budget_s
    order = random.Random(seed)
    base: list[float] = []
    cand: list[float] = []
    stopped = "max_rounds"
    with timing_ctx, torch.inference_mode():
        _warm_up(baseline, candidate, warmup, device, time.perf_counter() + budget_s / 4)
        round_cap = budget_s / (2 * max(min_rounds, 1))
        inner, round_s = _calibrate(timer, baseline, candidate, min_sample_s, round_cap)
        while len(base) < max_rounds:
            if time.perf_counter() + round_s > deadline:
                stopped = "budget"
                break
            started = time.perf_counter()
            if order.random() < 0.5:
                base.append(timer(baseline, inner))
                cand.append(timer(candidate, inner))
            else:
                cand.append(timer(candidate, inner))
                base.append(timer(baseline, inner))
            round_s = time.perf_counter() - started
            if len(base) >= min_rounds:
                speedup, low, high = summarise(base, cand, confidence)
                if _relative_width(speedup, low, high) <= target_rel_ci:
                    stopped = "converged"
                    break
            else:
                inner, round_s = _fit_rounds(
                    inner, round_s, deadline - time.perf_counter(), min_rounds - len(base)
                )
    s = summarize(base, cand, confidence)  # the reported figures; an open side is 0 or inf here
    speedup = math.nan if s.speedup is None else s.speedup
    low = 0.0 if s.low is None else s.low
    high = math.inf if s.high is None else s.high
    return Comparison(
        base, cand, speedup, low, high, len(base), stopped, inner, confidence, str(device), pinned
    )


def _warm_up(
    baseline: Callable[[], Any],
    candidate: Callable[[], Any],
    calls: int,
    device: Device,
    until: float,
) -> None:
    """First calls pay for allocation, lazy init and autotuning: not the steady state."""
    for i in range(max(calls, 1)):
        if i > 0 and time.perf_counter() > until:
            break
        baseline()
        candidate()
    if device.kind == "cuda":
        torch.cuda.synchronize(device.torch_device)


# ---------------------------------------------------------------------------- outputs


def _cloned(inputs: tuple) -> tuple:
    """Each call gets its own copy, so an in-place op in one cannot change what the next sees."""
    return pytree.tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, inputs)


def _float64_twin(reference: Callable[..., Any]) -> Callable[..., Any] | None:
    """The reference in float64, when it is a module small enough to copy."""
    if not isinstance(reference, torch.nn.Module):
        return None
    size = sum(t.numel() * 8 for t in [*reference.parameters(), *reference.buffers()])
    if size > MAX_FLOAT64_BYTES:
        return None
    try:
        with torch.no_grad(), warnings.catch_warnings(action="ignore", category=FutureWarning):
            twin = copy.deepcopy(reference).double()
    except Exception as exc:
        failures.fallback(exc, "a float64 copy of the reference", failures.anything)
        return None

    def run(*inputs: Any) -> Any:
        return twin(
            *pytree.tree_map(
                lambda v: (
                    v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                ),
                inputs,
            )
        )

    return run


def check_outputs(
    reference: Callable[..., Any],
    candidate: Callable[..., Any],
    inputs_list: Sequence[tuple],
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> str | None:
    """None when the candidate's outputs match; else the reason.

    A fixed tolerance is either too tight for a legal reordering of a long float32 sum or too
    loose to see a small real error, so the tolerance also grows with the reference's own
    error: its run-to-run spread (two runs, so nondeterministic ops don't fail a correct
    rewrite) and, where a float64 copy of it can run, its distance from that float64 result,
    which then also serves as the value compared against.
    """
    twin = _float64_twin(reference)
    with torch.inference_mode():
        for i, inputs in enumerate(inputs_list):
            first = pytree.tree_flatten(reference(*_cloned(inputs)))[0]
            second = pytree.tree_flatten(reference(*_cloned(inputs)))[0]
            try:
                got = pytree.tree_flatten(candidate(*_cloned(inputs)))[0]
            except Exception as exc:
                reason = failures.fallback(exc, "an output check: the candidate's run").reason
                return f"input set {i}: the candidate raised {reason}"
            exact: list[Any] | None = None
            if twin is not None:
                try:
                    exact = pytree.tree_flatten(twin(*_cloned(inputs)))[0]
                except Exception as exc:
                    failures.fallback(exc, "the reference in float64", failures.anything)
                    twin = None
            if len(got) != len(first):
                return f"input set {i}: {len(got)} outputs, expected {len(first)}"
            for j, (r1, r2, c) in enumerate(zip(first, second, got, strict=True)):
                truth = exact[j] if exact is not None and len(exact) == len(first) else None
                reason = leaf_mismatch(r1, r2, truth, c, rtol, atol)
                if reason is not None:
                    return f"input set {i}, output {j}: {reason}"
    return None


def leaf_mismatch(
    ref: Any, ref_again: Any, truth: Any, got: Any, rtol: float, atol: float
) -> str | None:
    """Why `got` differs from `ref` beyond the reference's own noise (`ref_again`: a second
    run; `truth`: a float64 result or None), or None. Shared with `tuner.training.step`."""
    if not isinstance(ref, torch.Tensor):
        return None if got == ref else f"got {got!r}, expected {ref!r}"
    if not isinstance(got, torch.Tensor):
        return f"got {type(got).__name__}, expected a tensor"
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return f"got {got.dtype}{list(got.shape)}, expected {ref.dtype}{list(ref.shape)}"
    if not (ref.is_floating_point() or ref.is_complex()):
        differ = (got != ref) & (ref == ref_again)
        return f"{int(differ.sum())} of {ref.numel()} elements differ" if differ.any() else None
    return _float_mismatch(ref, ref_again, truth, got, rtol, atol)


def _as_float64(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return torch.view_as_real(t.to(torch.complex128)) if t.is_complex() else t.to(torch.float64)


def _float_mismatch(
    ref: torch.Tensor,
    ref_again: torch.Tensor,
    truth: Any,
    got: torch.Tensor,
    rtol: float,
    atol: float,
) -> str | None:
    r1, r2, c = (_as_float64(t) for t in (ref, ref_again, got))
    usable = isinstance(truth, torch.Tensor) and truth.shape == ref.shape
    t = _as_float64(truth.to(ref.device)) if usable else r1
    finite = torch.isfinite(r1) & torch.isfinite(r2) & torch.isfinite(t)
    special = ~finite & (r1.isnan() == r2.isnan()) & ((r1 == r2) | r1.isnan())
    bad_special = special & ~((c == r1) | (c.isnan() & r1.isnan()))
    if bad_special.any():
        return f"{int(bad_special.sum())} nan/inf elements differ from the reference"
    if not finite.any():
        return None
    noise = (r1 - r2).abs()[finite].max() + (r1 - t).abs()[finite].max()
    allowed = atol + rtol * t.abs() + NOISE_FACTOR * noise
    error = (c - t).abs().nan_to_num(nan=math.inf)
    excess = torch.where(finite, error - allowed, torch.full_like(error, -math.inf))
    worst = int(excess.flatten().argmax())
    if excess.flatten()[worst] <= 0:
        return None
    return (
        f"max error {float(error.flatten()[worst]):.3g} > allowed "
        f"{float(allowed.flatten()[worst]):.3g} at flat index {worst} "
        f"(got {c.flatten()[worst].item():.6g}, expected {t.flatten()[worst].item():.6g}); "
        f"{int((excess > 0).sum())} of {ref.numel()} elements out of tolerance"
    )


# ---------------------------------------------------------------------------- inputs


def fresh_inputs(inputs: tuple, count: int, seed: int = 0) -> list[tuple]:
    """Variants of recorded inputs: floats perturbed (same shape, dtype, strides), integers kept.

    Floats are scaled elementwise by exp(0.1 * N(0, 1)) rather than redrawn: signs, zeros,
    masks and the rough range survive (a log or sqrt of an input stays defined), yet every
    nonzero value changes. Integer and bool tensors (indices, offsets, lengths) and non-tensors
    are kept, because changing them would make the inputs invalid, not merely new.
    """
    gen = torch.Generator().manual_seed(seed)
    return [pytree.tree_map(lambda v: _perturbed(v, gen), inputs) for _ in range(count)]


def _perturbed(value: Any, gen: torch.Generator) -> Any:
    if not isinstance(value, torch.Tensor):
        return value
    if not value.is_floating_point():
        return value.clone()
    work = torch.float64 if value.dtype == torch.float64 else torch.float32
    noise = torch.randn(value.shape, generator=gen, dtype=work).to(value.device)
    out = torch.empty_like(value)
    out.copy_(value.detach().to(work) * torch.exp(0.1 * noise))
    return out
