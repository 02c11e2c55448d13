"""MAIProf / Holistic Trace Analysis style profiles of a callable, reduced with pandas.

A profile answers "where does an iteration go": time by kind of op (GEMM/conv, norms, pointwise,
data movement, ...), how many ops and kernels one iteration dispatches, how much host time is
overhead rather than op work, how long the device sits idle, and the memory peak. The tuner takes
one of the baseline and one of the tuned model; fewer ops, fewer kernels and less overhead are
what horizontal fusion is for, so the two profiles show whether it happened.

Absolute times are inflated by the profiler itself (most for tiny ops): compare profiles with
each other, and take speedups from `measure`, not from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tuner.contract.device import Device
from tuner.contract.errors import FxtuneError
from tuner.host import failures
from tuner.profiling.analysis import (
    ITERATION,
    PHASES,
    category_totals,
    compiled_kernel_calls,
    device_activity,
    device_idle_us,
    iteration_windows,
    kernel_count,
    launch_time_us,
    peak_allocated_bytes,
    phase_of,
    phase_windows,
    reduce_events,
)
from tuner.profiling.categories import CATEGORIES, COMPILED_REGION, category_of
from tuner.profiling.counting import count_dispatched_ops
from tuner.profiling.frames import events_frame, kineto_frame, op_frame

__all__ = [
    "ProfileError",
    "ProfileSummary",
    "breakdown_frame",
    "category_of",
    "events_frame",
    "profile_callable",
]

TOP_OPS = 15
# Kinds of tuner.contract.device.KINDS that can be profiled (the profiler has no XLA activity).
PROFILED_KINDS = ("cpu", "cuda")


class ProfileError(FxtuneError):
    """The profile cannot be taken as asked (a device kind it cannot profile, bad iteration count).

    A malformed or absent device raises tuner.contract.errors' device errors instead.
    """


@dataclass
class ProfileSummary:
    """Per-iteration figures of one profiled callable.

    Times are microseconds per iteration. A figure that could not be measured is None and
    `missing` holds "<figure>: <why>"; a measured zero is a zero.

    - `ops_per_iter`: ATen ops dispatched in one iteration, counted by a TorchDispatchMode in a
      separate, unprofiled iteration.
    - `kernels_per_iter`: on CUDA, kernels joined to their launch calls by correlation id; on CPU,
      inductor's generated C++ kernels (visible only when compiled with
      `torch._inductor.config.cpp.enable_kernel_profile`), None for eager code, whose kernels are
      its ATen ops.
    - `time_by_category_us`: op self time (CPU) or device time of what each op launched (CUDA),
      summed per category of `tuner.profiling.categories`.
    - `cpu_dispatch_overhead_us`: on CPU, iteration wall time minus the self time of all ops and
      generated kernels, i.e. host time outside any op: Python, module calls, graph wrappers,
      dynamo guards; dispatcher cost inside an op stays with that op. On CUDA, host time spent
      in launch calls (kernels, graphs, async copies), which fusion reduces with each kernel.
    - `device_idle_us`: CUDA only: iteration span (host range, which ends with a synchronize)
      minus the union of device work intervals in it.
    - `peak_memory_bytes`: CUDA `max_memory_allocated` over the profiled iterations (weights
      included); on CPU the peak of the allocations the iterations made on top of what was alive
      when profiling began (from the profiler's memory records).
    - `wall_us_per_iter`: mean span of the iteration ranges under the profiler.
    - `phases`: for a training step (`tuner.training.step`, which marks its forward with the loss,
    its   backward and its optimizer step), per phase: `wall_us_per_iter` (the phase's host range),
      `op_calls_per_iter` (op events, nested ones included), `kernels_per_iter` (CUDA) and
      `time_by_category_us`, attributed by when each op started (and on CUDA, what it launched).
      Empty for inference.
    """

    device: str
    iterations: int
    ops_per_iter: float | None
    kernels_per_iter: float | None
    time_by_category_us: dict[str, float]
    wall_us_per_iter: float
    cpu_dispatch_overhead_us: float | None
    device_idle_us: float | None
    peak_memory_bytes: int | None
    trace_path: str | None
    top_ops: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def reason(self, figure: str) -> str | None:
        """Why `figure` is missing, or None when it was measured."""
        prefix = f"{figure}: "
        return next((m[len(prefix) :] for m in self.missing if m.startswith(prefix)), None)


def profileable(device: Device | str) -> Device:
    """The device, if it can be profiled here; checked before anything is moved there."""
    device = Device.parse(device)
    if device.kind not in PROFILED_KINDS:
        raise ProfileError(
            f"cannot profile on {device.kind!r}; profiles are taken on {PROFILED_KINDS}"
        )
    return device.require_available()


def _check(device: Device, iterations: int, warmup: int) -> None:
    if iterations < 1 or warmup < 0:
        raise ProfileError("iterations must be >= 1 and warmup >= 0")


def _sync(device: Device) -> None:
    if device.kind == "cuda":
        torch.cuda.synchronize(device.torch_device)


def _count_ops(fn: Callable[[], Any], device: Device, missing: list[str]) -> float | None:
    try:
        counts = count_dispatched_ops(fn)
    except Exception as exc:  # a callable the mode cannot run through: record it, keep profiling
        failures.fallback(exc, "counting ops under TorchDispatchMode")
        missing.append(f"ops_per_iter: counting under TorchDispatchMode failed ({exc})")
        return None
    finally:
        _sync(device)
    return float(sum(counts.values()))


def _record(fn: Callable[[], Any], device: Device, iterations: int) -> profile:
    activities = [ProfilerActivity.CPU]
    if device.kind == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.reset_peak_memory_stats(device.torch_device)
    with profile(activities=activities, profile_memory=True) as prof:
        for _ in range(iterations):
            with record_function(ITERATION):
                fn()
                _sync(device)
    return prof


def profile_callable(
    fn: Callable[[], Any],
    *,
    device: Device | str = "cpu",
    iterations: int = 20,
    warmup: int = 3,
    trace_path: Path | None = None,
) -> ProfileSummary:
    """Profile `iterations` calls of `fn` (inference: under no_grad) after `warmup` calls.

    `fn` must already be on `device`. One extra unprofiled call counts the dispatched ops. With
    `trace_path`, the chrome trace is written there (opens in Perfetto or chrome://tracing).
    """
    device = profileable(device)
    _check(device, iterations, warmup)
    missing: list[str] = []
    # The memory peak is read from torch's current CUDA device: make it the one profiled.
    current = torch.cuda.device(device.index) if device.index is not None else nullcontext()
    with current:
        with torch.no_grad():
            for _ in range(warmup):
                fn()
            _sync(device)
            ops_per_iter = _count_ops(fn, device, missing)
            prof = _record(fn, device, iterations)
        if trace_path is not None:
            Path(trace_path).parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(trace_path))
        raw = kineto_frame(prof)
        windows = iteration_windows(raw)
        wall = float((windows["end_us"] - windows["start_us"]).mean())
        summarize = _summarize_cuda if device.kind == "cuda" else _summarize_cpu
        ops = op_frame(prof)
        figures = summarize(raw, ops, iterations, wall, missing)
        phases = _phases(raw, ops, device, iterations)
    return ProfileSummary(
        device=str(device),
        iterations=iterations,
        ops_per_iter=ops_per_iter,
        wall_us_per_iter=wall,
        trace_path=str(trace_path) if trace_path is not None else None,
        missing=missing,
        phases=phases,
        **figures,
    )


def _phases(
    raw: pd.DataFrame, ops: pd.DataFrame, device: Device, iterations: int
) -> dict[str, dict[str, Any]]:
    """Per phase of a training step, its share of the step (see `ProfileSummary.phases`)."""
    windows = phase_windows(raw)
    if windows.empty:
        return {}
    in_phase = phase_of(ops["start_us"], windows)
    activity = device_activity(raw) if device.kind == "cuda" else None
    column = "device_us" if activity is not None and len(activity) else "self_us"
    out: dict[str, dict[str, Any]] = {}
    for phase in PHASES:
        spans = windows[windows["phase"] == phase]
        if spans.empty:
            continue
        mine = ops[in_phase == phase]
        launched = None
        if activity is not None and len(activity):
            launched = activity[activity["op_id"].isin(mine["id"])]
        events = reduce_events(mine, launched)
        out[phase] = {
            "wall_us_per_iter": float((spans["end_us"] - spans["start_us"]).sum()) / iterations,
            "op_calls_per_iter": float(events["calls"].sum()) / iterations,
            "kernels_per_iter": (
                kernel_count(launched) / iterations if launched is not None else None
            ),
            "time_by_category_us": _by_category(events, column, iterations),
        }
    return out


def _top_ops(events: pd.DataFrame, column: str, iterations: int) -> list[dict[str, Any]]:
    top = events.sort_values(column, ascending=False).head(TOP_OPS)
    return [
        {
            "name": str(row.name),
            "category": str(row.category),
            "calls_per_iter": float(row.calls) / iterations,
            "us_per_iter": float(getattr(row, column)) / iterations,
            "host_us_per_iter": float(row.self_us) / iterations,
        }
        for row in top.itertuples(index=False)
    ]


def _by_category(events: pd.DataFrame, column: str, iterations: int) -> dict[str, float]:
    totals = category_totals(events, column, CATEGORIES) / iterations
    return {str(k): float(v) for k, v in totals.items()}


def _summarize_cpu(
    raw: pd.DataFrame, ops: pd.DataFrame, iterations: int, wall: float, missing: list[str]
) -> dict[str, Any]:
    events = reduce_events(ops, None)
    kernels = compiled_kernel_calls(events)
    if kernels == 0:
        compiled = raw["name"].map(lambda n: COMPILED_REGION.search(n) is not None).any()
        missing.append(
            "kernels_per_iter: "
            + (
                "inductor ran but its C++ kernels are not in the trace; compile with "
                "torch._inductor.config.cpp.enable_kernel_profile = True"
                if compiled
                else "no generated kernels ran: eager CPU code's kernels are its ATen ops "
                "(see ops_per_iter)"
            )
        )
    missing.append("device_idle_us: on CPU the host runs the kernels; there is no device to idle")
    peak = peak_allocated_bytes(raw, "cpu")
    if peak is None:
        missing.append("peak_memory_bytes: the profiler recorded no CPU memory events")
    return {
        "kernels_per_iter": kernels / iterations if kernels else None,
        "time_by_category_us": _by_category(events, "self_us", iterations),
        "cpu_dispatch_overhead_us": max(wall - float(events["self_us"].sum()) / iterations, 0.0),
        "device_idle_us": None,
        "peak_memory_bytes": peak,
        "top_ops": _top_ops(events, "self_us", iterations),
    }


def _summarize_cuda(
    raw: pd.DataFrame, ops: pd.DataFrame, iterations: int, wall: float, missing: list[str]
) -> dict[str, Any]:
    activity = device_activity(raw)
    launch = launch_time_us(raw)
    if launch is None:
        missing.append("cpu_dispatch_overhead_us: no launch calls in the trace")
    figures: dict[str, Any] = {
        "peak_memory_bytes": int(torch.cuda.max_memory_allocated()),
        "cpu_dispatch_overhead_us": launch / iterations if launch is not None else None,
    }
    if activity.empty:
        for figure in ("kernels_per_iter", "device_idle_us", "time_by_category_us"):
            missing.append(f"{figure}: no device activity in the trace (is CUPTI available?)")
        events = reduce_events(ops, None)
        return figures | {
            "kernels_per_iter": None,
            "device_idle_us": None,
            "time_by_category_us": {},
            "top_ops": _top_ops(events, "self_us", iterations),
        }
    events = reduce_events(ops, activity)
    return figures | {
        "kernels_per_iter": kernel_count(activity) / iterations,
        "device_idle_us": device_idle_us(activity, iteration_windows(raw)),
        "time_by_category_us": _by_category(events, "device_us", iterations),
        "top_ops": _top_ops(events, "device_us", iterations),
    }


def breakdown_frame(summaries: Mapping[str, ProfileSummary]) -> pd.DataFrame:
    """One row per category; per summary label, `<label>_us` (per iteration) and `<label>_share`.

    A share is of the summary's categorised time. Categories a summary did not measure are NaN,
    as are shares of a zero total.
    """
    names = list(CATEGORIES)
    for summary in summaries.values():
        names += [c for c in summary.time_by_category_us if c not in names]
    frame = pd.DataFrame({"category": pd.array(names, dtype="string")})
    for label, summary in summaries.items():
        times = summary.time_by_category_us
        us = pd.Series([times.get(c, float("nan")) for c in names], dtype="float64")
        total = float(us.sum())
        frame[f"{label}_us"] = us
        frame[f"{label}_share"] = us / total if total > 0 else us * float("nan")
    return frame
