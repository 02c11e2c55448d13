"""The trace arithmetic on synthetic event tables shaped like kineto's (CUDA ones included)."""

import math
from typing import Any

import pandas as pd
import pytest

from tuner.profiling.analysis import (
    ITERATION,
    OP_COLUMNS,
    RAW_COLUMNS,
    busy_us,
    category_totals,
    compiled_kernel_calls,
    device_activity,
    device_idle_us,
    iteration_windows,
    kernel_count,
    launch_time_us,
    peak_allocated_bytes,
    phase_of,
    phase_range,
    phase_windows,
    reduce_events,
    typed,
)
from tuner.profiling.categories import CATEGORIES


def event(
    name: str, kind: str, start: float, end: float, corr: int = 0, linked: int = 0, **kw: Any
) -> dict[str, Any]:
    device = "cuda" if kind in {"kernel", "gpu_memcpy", "gpu_memset"} else "cpu"
    row = {
        "name": name,
        "kind": kind,
        "device": device,
        "correlation_id": corr,
        "linked_correlation_id": linked,
        "start_us": start,
        "end_us": end,
        "nbytes": 0,
    }
    return row | kw


def gpu_trace() -> pd.DataFrame:
    """One iteration [0, 100): three ops launch a GEMM, a tanh and a copy; a CUDA graph launches
    two overlapping triton kernels; an NCCL kernel has lost its launch record."""
    return typed(
        [
            event(ITERATION, "user_annotation", 0, 100, corr=1),
            event(ITERATION, "gpu_user_annotation", 18, 97, corr=1),
            event("aten::addmm", "cpu_op", 5, 30, corr=2),
            event("aten::tanh", "cpu_op", 35, 50, corr=3),
            event("aten::copy_", "cpu_op", 50, 60, corr=4),
            event("cudaLaunchKernel", "cuda_runtime", 10, 15, corr=101, linked=2),
            event("ampere_sgemm_64x32_tn", "kernel", 20, 40, corr=101, linked=2),
            event("cudaLaunchKernel", "cuda_runtime", 40, 44, corr=102, linked=3),
            event("elementwise_kernel<tanh>", "kernel", 45, 55, corr=102, linked=3),
            event("cudaMemcpyAsync", "cuda_runtime", 52, 58, corr=103, linked=4),
            event("Memcpy DtoD", "gpu_memcpy", 60, 62, corr=103, linked=4),
            event("cudaGraphLaunch", "cuda_runtime", 62, 66, corr=104),
            event("triton_poi_fused_tanh_0", "kernel", 70, 75, corr=104),
            event("triton_poi_fused_add_1", "kernel", 74, 80, corr=104),
            event("ncclDevKernel_AllReduce", "kernel", 85, 95, corr=105),
            event("cudaDeviceSynchronize", "cuda_runtime", 66, 99, corr=106),
        ],
        RAW_COLUMNS,
    )


def gpu_ops() -> pd.DataFrame:
    rows = [
        (2, "aten::addmm", 12.0, 11.0),
        (3, "aten::tanh", 8.0, 31.0),
        (4, "aten::copy_", 3.0, 56.0),
    ]
    return typed([dict(zip(OP_COLUMNS, r, strict=True)) for r in rows], OP_COLUMNS)


def test_launches_join_kernels_by_correlation_id() -> None:
    activity = device_activity(gpu_trace()).set_index("name")
    assert len(activity) == 6
    assert kernel_count(activity) == 5
    assert activity.loc["ampere_sgemm_64x32_tn", "op_id"] == 2
    assert activity.loc["ampere_sgemm_64x32_tn", "launch_name"] == "cudaLaunchKernel"
    assert activity.loc["ampere_sgemm_64x32_tn", "launch_dur_us"] == 5
    assert activity.loc["Memcpy DtoD", "op_id"] == 4
    assert activity.loc["Memcpy DtoD", "launch_name"] == "cudaMemcpyAsync"
    graph_kernels = ["triton_poi_fused_tanh_0", "triton_poi_fused_add_1"]
    assert set(activity.loc[graph_kernels, "launch_name"]) == {"cudaGraphLaunch"}
    assert activity.loc["ncclDevKernel_AllReduce", "op_id"] == 0
    assert math.isnan(activity.loc["ncclDevKernel_AllReduce", "launch_start_us"])
    assert activity.loc["elementwise_kernel<tanh>", "dur_us"] == 10


def test_launch_time_counts_launch_calls_only() -> None:
    assert launch_time_us(gpu_trace()) == 5 + 4 + 6 + 4
    cpu_only = typed([event("aten::mm", "cpu_op", 0, 3, corr=1)], RAW_COLUMNS)
    assert launch_time_us(cpu_only) is None


def test_device_idle_is_window_minus_union_of_device_work() -> None:
    raw = gpu_trace()
    activity = device_activity(raw)
    # busy: [20, 40) + [45, 55) + [60, 62) + [70, 80) (two overlapping kernels) + [85, 95)
    assert busy_us(activity, 0, 100) == pytest.approx(20 + 10 + 2 + 10 + 10)
    assert device_idle_us(activity, iteration_windows(raw)) == pytest.approx(48)


def test_device_idle_clips_work_to_each_window() -> None:
    work = pd.DataFrame(
        {"start_us": [10.0, 20.0, 150.0, 290.0], "end_us": [30.0, 25.0, 250.0, 400.0]}
    )
    windows = pd.DataFrame({"start_us": [0.0, 200.0], "end_us": [100.0, 300.0]})
    # window 1: busy 20 -> idle 80; window 2: [200, 250) + [290, 300) busy 60 -> idle 40
    assert device_idle_us(work, windows) == pytest.approx(60)
    assert device_idle_us(work, windows.iloc[:0]) is None
    assert busy_us(work.iloc[:0], 0, 10) == 0.0


def test_reduce_events_attributes_device_time_to_launching_ops() -> None:
    events = reduce_events(gpu_ops(), device_activity(gpu_trace())).set_index("name")
    assert events.loc["aten::addmm", "device_us"] == 20
    assert events.loc["aten::tanh", "device_us"] == 10
    assert events.loc["aten::copy_", "device_us"] == 2
    assert events.loc["aten::addmm", "self_us"] == 12
    # work no known op launched keeps its own name and counts as a call
    assert events.loc["ncclDevKernel_AllReduce", "device_us"] == 10
    assert events.loc["triton_poi_fused_add_1", "calls"] == 1
    totals = category_totals(events.reset_index(), "device_us", CATEGORIES)
    assert totals["matmul_conv"] == 20
    assert totals["pointwise"] == 10 + 5 + 6
    assert totals["data_movement"] == 2
    assert totals["collective"] == 10
    assert totals["norm"] == 0
    assert totals.sum() == pytest.approx(20 + 10 + 2 + 5 + 6 + 10)


def test_reduce_events_without_device_marks_device_time_missing() -> None:
    ops = typed(
        [
            {"id": 1, "name": "aten::tanh", "self_us": 2.0},
            {"id": 2, "name": "aten::tanh", "self_us": 3.0},
            {"id": 3, "name": "graph_0_cpp_fused_tanh_0", "self_us": 1.0},
        ],
        OP_COLUMNS,
    )
    events = reduce_events(ops, None)
    assert list(events.columns) == ["name", "category", "calls", "self_us", "device_us"]
    assert events["device_us"].isna().all()
    tanh = events.set_index("name").loc["aten::tanh"]
    assert (tanh["calls"], tanh["self_us"]) == (2, 5.0)
    assert compiled_kernel_calls(events) == 1
    assert str(events["calls"].dtype) == "int64"


def test_peak_allocated_bytes_is_highest_running_total() -> None:
    records = [
        event("[memory]", "cpu_instant_event", t, t, nbytes=n)
        for t, n in [(1, 100), (2, 50), (3, -100), (4, 30), (5, -80)]
    ]
    cuda_record = event("[memory]", "cpu_instant_event", 6, 6, nbytes=10**9) | {"device": "cuda"}
    raw = typed([*records, cuda_record], RAW_COLUMNS)
    assert peak_allocated_bytes(raw, "cpu") == 150
    assert peak_allocated_bytes(raw, "cuda") == 10**9
    assert peak_allocated_bytes(raw.iloc[:0], "cpu") is None


def test_iteration_windows_take_host_annotations_only() -> None:
    windows = iteration_windows(gpu_trace())
    assert windows.to_dict("records") == [{"start_us": 0.0, "end_us": 100.0}]


def test_ops_fall_in_the_phase_whose_range_they_started_in() -> None:
    """Forward [0, 40), backward [40, 90), optimizer [90, 99); an op before, between or after
    the ranges has no phase, and a device annotation of the same name is not a range."""
    raw = typed(
        [
            event(phase_range("forward"), "user_annotation", 0, 40),
            event(phase_range("backward"), "user_annotation", 40, 90),
            event(phase_range("optimizer"), "user_annotation", 95, 99),
            event(phase_range("backward"), "gpu_user_annotation", 0, 200),
            event(ITERATION, "user_annotation", 0, 100),
        ],
        RAW_COLUMNS,
    )
    windows = phase_windows(raw)
    assert windows["phase"].tolist() == ["forward", "backward", "optimizer"]
    starts = pd.Series([41.0, 5.0, 92.0, 96.0, 40.0, 150.0], index=[10, 11, 12, 13, 14, 15])
    got = phase_of(starts, windows)
    assert got.index.tolist() == starts.index.tolist()
    expected = ["backward", "forward", None, "optimizer", "backward", None]
    assert [None if pd.isna(p) else p for p in got] == expected
    assert phase_of(starts, windows.iloc[:0]).isna().all()
    with pytest.raises(ValueError, match="unknown phase"):
        phase_range("loss")
