"""Reductions of profiler event tables, as pure functions of DataFrames.

Two tables come out of a profile (see `frames`):

- the raw table, one row per kineto event: `name`, `kind` (kineto's activity type: `cpu_op`,
  `user_annotation`, `cuda_runtime`, `cuda_driver`, `kernel`, `gpu_memcpy`, `gpu_memset`,
  `cpu_instant_event` for memory records, ...), `device` (`cpu` / `cuda`), `correlation_id`,
  `linked_correlation_id`, `start_us`, `end_us`, `nbytes`;
- the op table, one row per host op event: `id` (its correlation id), `name`, `self_us`.

On CUDA a launch call (runtime or driver API) and the device work it starts share a CUPTI
correlation id, and the launch's `linked_correlation_id` is the id of the innermost op that was
running on the host; HTA joins kernels to ops the same way.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from tuner.contract.training import PHASES
from tuner.profiling.categories import category_of, is_compiled_kernel

RAW_COLUMNS: dict[str, str] = {
    "name": "object",
    "kind": "object",
    "device": "object",
    "correlation_id": "int64",
    "linked_correlation_id": "int64",
    "start_us": "float64",
    "end_us": "float64",
    "nbytes": "int64",
}
OP_COLUMNS: dict[str, str] = {
    "id": "int64",
    "name": "object",
    "self_us": "float64",
    "start_us": "float64",
}
EVENT_COLUMNS: dict[str, str] = {
    "name": "string",
    "category": "string",
    "calls": "int64",
    "self_us": "float64",
    "device_us": "float64",
}

ITERATION = "fxtune.iteration"
# Ranges a training step marks around its forward (with the loss), backward and optimizer step.
PHASE = "fxtune.phase."
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
API_KINDS = ("cuda_runtime", "cuda_driver")
LAUNCH = re.compile(r"^cu(?:da)?(?:LaunchKernel|LaunchCooperativeKernel|GraphLaunch|Mem\w*Async)")
MEMORY_EVENT = "[memory]"


def typed(rows: list[dict] | pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """A frame with exactly `columns` in their dtypes, also when there are no rows."""
    frame = pd.DataFrame(rows, columns=list(columns))
    return frame.astype(columns)


def iteration_windows(raw: pd.DataFrame) -> pd.DataFrame:
    """Host time ranges of the profiled iterations (the `ITERATION` annotations)."""
    rows = raw[(raw["kind"] == "user_annotation") & (raw["name"] == ITERATION)]
    return rows[["start_us", "end_us"]].sort_values("start_us").reset_index(drop=True)


def phase_range(phase: str) -> str:
    """The annotation name of one phase of a step (`PHASES`)."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; phases are {PHASES}")
    return PHASE + phase


def phase_windows(raw: pd.DataFrame) -> pd.DataFrame:
    """Host time ranges of the phases a step marked: `phase`, `start_us`, `end_us`."""
    rows = raw[(raw["kind"] == "user_annotation") & raw["name"].str.startswith(PHASE)]
    windows = rows[["name", "start_us", "end_us"]].sort_values("start_us", kind="stable")
    phases = windows.pop("name").str.removeprefix(PHASE)
    return windows.assign(phase=phases.to_numpy()).reset_index(drop=True)


def phase_of(starts: pd.Series, windows: pd.DataFrame) -> pd.Series:
    """The phase each host start time falls in (NaN outside every phase), in `starts` order.

    Phases of one thread never overlap, so the last window that began before a time is the only
    one that can hold it. Backward ops run on autograd's threads on CUDA; their times still fall
    inside the backward range the calling thread holds open."""
    if windows.empty or starts.empty:
        return pd.Series(np.nan, index=starts.index, dtype="object")
    left = pd.DataFrame({"start_us": starts.to_numpy(), "row": np.arange(len(starts))})
    joined = pd.merge_asof(
        left.sort_values("start_us", kind="stable"),
        windows.rename(columns={"end_us": "window_end_us"}),
        on="start_us",
        direction="backward",
    ).sort_values("row")
    inside = joined["start_us"] <= joined["window_end_us"]
    return pd.Series(joined["phase"].where(inside).to_numpy(), index=starts.index, dtype="object")


def device_activity(raw: pd.DataFrame) -> pd.DataFrame:
    """Device work joined to the API call that launched it, by correlation id.

    One row per kernel / memcpy / memset: its name, kind, interval and duration, the launching
    call's name, start and duration (NaN when the trace lost the call) and `op_id`, the host op
    that made the call (0 when none). A graph launch starts many kernels under one id.
    """
    work = raw[raw["kind"].isin(DEVICE_WORK)]
    calls = raw[raw["kind"].isin(API_KINDS) & (raw["correlation_id"] > 0)]
    calls = calls.drop_duplicates("correlation_id")[
        ["correlation_id", "name", "start_us", "end_us", "linked_correlation_id"]
    ].rename(
        columns={
            "name": "launch_name",
            "start_us": "launch_start_us",
            "end_us": "launch_end_us",
            "linked_correlation_id": "launch_op_id",
        }
    )
    joined = work.merge(calls, on="correlation_id", how="left")
    op_id = joined["launch_op_id"].fillna(joined["linked_correlation_id"])
    return pd.DataFrame(
        {
            "name": joined["name"].astype("object"),
            "kind": joined["kind"].astype("object"),
            "correlation_id": joined["correlation_id"].astype("int64"),
            "start_us": joined["start_us"].astype("float64"),
            "end_us": joined["end_us"].astype("float64"),
            "dur_us": (joined["end_us"] - joined["start_us"]).astype("float64"),
            "launch_name": joined["launch_name"].astype("object"),
            "launch_start_us": joined["launch_start_us"].astype("float64"),
            "launch_dur_us": (joined["launch_end_us"] - joined["launch_start_us"]).astype(
                "float64"
            ),
            "op_id": op_id.astype("int64"),
        }
    )


def kernel_count(activity: pd.DataFrame) -> int:
    return int((activity["kind"] == "kernel").sum())


def launch_time_us(raw: pd.DataFrame) -> float | None:
    """Host time inside launch calls (kernels, graphs, async copies); None when there were none."""
    calls = raw[raw["kind"].isin(API_KINDS) & raw["name"].map(lambda n: bool(LAUNCH.match(n)))]
    if calls.empty:
        return None
    return float((calls["end_us"] - calls["start_us"]).sum())


def busy_us(intervals: pd.DataFrame, start: float, end: float) -> float:
    """Length of the union of `[start_us, end_us)` intervals, clipped to `[start, end)`."""
    clipped = pd.DataFrame(
        {
            "s": intervals["start_us"].clip(lower=start, upper=end),
            "e": intervals["end_us"].clip(lower=start, upper=end),
        }
    )
    clipped = clipped[clipped["e"] > clipped["s"]].sort_values("s")
    if clipped.empty:
        return 0.0
    reach = clipped["e"].cummax()
    # a new busy stretch starts where an interval begins after everything before it has ended
    group = (clipped["s"] > reach.shift(fill_value=-np.inf)).cumsum()
    spans = clipped.groupby(group).agg(s=("s", "min"), e=("e", "max"))
    return float((spans["e"] - spans["s"]).sum())


def device_idle_us(activity: pd.DataFrame, windows: pd.DataFrame) -> float | None:
    """Mean per window of its length minus the time some device work ran; None if no windows."""
    if windows.empty:
        return None
    idle = [
        (w.end_us - w.start_us) - busy_us(activity, w.start_us, w.end_us)
        for w in windows.itertuples()
    ]
    return float(np.mean(idle))


def peak_allocated_bytes(raw: pd.DataFrame, device: str) -> int | None:
    """Highest running total of the allocator's records on `device` since profiling began.

    Memory alive when profiling started (weights, inputs) is not in the records, so this is the
    peak of what the profiled iterations allocated on top of it. None without records.
    """
    records = raw[(raw["name"] == MEMORY_EVENT) & (raw["device"] == device)]
    if records.empty:
        return None
    running = records.sort_values("start_us", kind="stable")["nbytes"].cumsum()
    return int(max(running.max(), 0))


def reduce_events(ops: pd.DataFrame, activity: pd.DataFrame | None) -> pd.DataFrame:
    """Per op name: category, calls, host self time and the device time of what it launched.

    Device work whose launching op is not in `ops` keeps its own name as a row, so the device
    column sums to all device time. Without device activity (`None`), `device_us` is NaN: not
    measured, rather than zero.
    """
    table = ops[["name", "self_us"]].assign(calls=1, device_us=0.0)
    if activity is not None:
        launched = activity.groupby("op_id")["dur_us"].sum()
        table["device_us"] = ops["id"].map(launched).fillna(0.0)
        orphans = activity[~activity["op_id"].isin(ops["id"])]
        if not orphans.empty:
            extra = pd.DataFrame({"name": orphans["name"], "device_us": orphans["dur_us"]})
            extra = extra.assign(self_us=0.0, calls=1)
            table = pd.concat([table, extra], ignore_index=True)
    grouped = (
        table.groupby("name", as_index=False, sort=False)
        .agg(calls=("calls", "sum"), self_us=("self_us", "sum"), device_us=("device_us", "sum"))
        .assign(category=lambda f: f["name"].map(category_of))
    )
    if activity is None:
        grouped["device_us"] = np.nan
    grouped = grouped.sort_values(["self_us", "name"], ascending=[False, True])
    return typed(grouped[list(EVENT_COLUMNS)].reset_index(drop=True), EVENT_COLUMNS)


def compiled_kernel_calls(events: pd.DataFrame) -> int:
    """Calls of inductor-generated kernels in a reduced event table."""
    mask = events["name"].map(lambda n: is_compiled_kernel(str(n))).astype(bool)
    return int(events.loc[mask, "calls"].sum())


def category_totals(events: pd.DataFrame, column: str, categories: tuple[str, ...]) -> pd.Series:
    """Summed `column` per category, in `categories` order; categories without ops are 0."""
    totals = events.groupby("category")[column].sum()
    return totals.reindex(list(categories), fill_value=0.0).astype("float64")
