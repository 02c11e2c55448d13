"""A finished `torch.profiler.profile` as DataFrames (see `analysis` for the columns)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from torch.profiler import profile

from tuner.profiling.analysis import (
    OP_COLUMNS,
    RAW_COLUMNS,
    device_activity,
    reduce_events,
    typed,
)
from tuner.profiling.categories import is_compiled_kernel, is_operator


def kineto_frame(prof: profile) -> pd.DataFrame:
    """Every kineto event, times in microseconds since the trace began."""
    result = prof.profiler.kineto_results if prof.profiler is not None else None
    if result is None:
        raise ValueError("the profiler has not finished (leave its `with` block first)")
    origin = result.trace_start_ns()
    rows = [
        {
            "name": e.name(),
            "kind": e.activity_type(),
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
    return event.activity_type == "cpu_op" and event.device_type.name == "CPU" and is_operator(name)


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
