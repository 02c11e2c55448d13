"""A finished `torch.profiler.profile` as DataFrames (see `analysis` for the columns)."""

from __future__ import annotations

import re
from typing import Any

import pandas as pd
from torch.profiler import profile

from tuner.profiling.analysis import (
    MEMORY_EVENT,
    OP_COLUMNS,
    RAW_COLUMNS,
    device_activity,
    reduce_events,
    typed,
)
from tuner.profiling.categories import is_compiled_kernel, is_operator

# Names kineto gives device copies and fills; every other device event is a kernel.
_DEVICE_KIND = (("Memcpy", "gpu_memcpy"), ("Memset", "gpu_memset"))
_RUNTIME = re.compile(r"^cuda[A-Z]")
_DRIVER = re.compile(r"^cu[A-Z]")
ANNOTATIONS = "fxtune."  # the ranges fxtune itself marks (ITERATION, the phases of a step)


def activity_kind(event: Any) -> str:
    """Kineto's activity type of an event (`cpu_op`, `kernel`, `cuda_runtime`, ...).

    torch 2.13's `_KinetoEvent` says it (`activity_type()`); torch 2.11's, which GPU images
    ship, has no such method (issue 11), so there it is read from what every version has: the
    device, the user-annotation flag and the name."""
    if hasattr(event, "activity_type"):
        return str(event.activity_type())
    name = event.name()
    on_device = event.device_type().name.lower() != "cpu"
    flag = getattr(event, "is_user_annotation", None)
    annotation = flag() if flag is not None else name.startswith(ANNOTATIONS)
    if annotation:
        return "gpu_user_annotation" if on_device else "user_annotation"
    if on_device:
        return next((kind for prefix, kind in _DEVICE_KIND if name.startswith(prefix)), "kernel")
    if name == MEMORY_EVENT:
        return "cpu_instant_event"
    if _RUNTIME.match(name):
        return "cuda_runtime"
    if _DRIVER.match(name):
        return "cuda_driver"
    return "cpu_op"


def kineto_frame(prof: profile) -> pd.DataFrame:
    """Every kineto event, times in microseconds since the trace began."""
    result = prof.profiler.kineto_results if prof.profiler is not None else None
    if result is None:
        raise ValueError("the profiler has not finished (leave its `with` block first)")
    origin = result.trace_start_ns()
    rows = [
        {
            "name": e.name(),
            "kind": activity_kind(e),
            "device": e.device_type().name.lower(),
            "correlation_id": e.correlation_id(),
            "linked_correlation_id": e.linked_correlation_id(),
            "start_us": (e.start_ns() - origin) / 1e3,
            "end_us": (e.end_ns() - origin) / 1e3,
            "nbytes": e.nbytes(),
        }
        for e in result.events()
    ]
    return typed(rows, RAW_COLUMNS)


def is_op_event(event: Any) -> bool:
    """Host events that do work: dispatcher ops and inductor kernels.

    Annotations and framework ranges (dynamo cache lookup, compiled-graph wrappers) are left out,
    so their self time counts as overhead, not as op time.
    """
    name = event.name
    if is_compiled_kernel(name):
        return True
    return (
        function_event_kind(event) == "cpu_op"
        and event.device_type.name == "CPU"
        and (is_operator(name))
    )


def function_event_kind(event: Any) -> str:
    """`activity_kind` for the profiler's `FunctionEvent`s: torch 2.13 keeps kineto's activity
    type on them (`activity_type`), torch 2.11 does not (it keeps `is_user_annotation`)."""
    kind = getattr(event, "activity_type", None)
    if kind is not None:
        return str(kind)
    if getattr(event, "is_user_annotation", False):
        return "user_annotation"
    if _RUNTIME.match(event.name):
        return "cuda_runtime"
    if _DRIVER.match(event.name):
        return "cuda_driver"
    return "cpu_op"


def op_frame(prof: profile) -> pd.DataFrame:
    """One row per host op event with its self time (time not spent in child events) and its
    start, on the raw table's clock."""
    rows = [
        {
            "id": e.id,
            "name": e.name,
            "self_us": e.self_cpu_time_total,
            "start_us": e.time_range.start,
        }
        for e in prof.events()
        if is_op_event(e)
    ]
    return typed(rows, OP_COLUMNS)


def events_frame(prof: profile) -> pd.DataFrame:
    """The reduced per-op table: name, category, calls, self_us (host) and device_us.

    `device_us` (what the op launched on the GPU, joined by correlation id) is NaN for a trace
    without device activity.
    """
    raw = kineto_frame(prof)
    activity = device_activity(raw)
    return reduce_events(op_frame(prof), activity if len(activity) else None)
