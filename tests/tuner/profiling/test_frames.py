"""Profiler events as frames: an event's kind where torch does not say it (torch 2.11)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from tuner.profiling.analysis import ITERATION, phase_range
from tuner.profiling.frames import activity_kind, function_event_kind, is_op_event


class WithoutActivityType:
    """A torch 2.13 kineto event seen through torch 2.11's interface: no `activity_type()`."""

    def __init__(self, event: Any, annotation_flag: bool = True) -> None:
        self._event = event
        if not annotation_flag:
            self.is_user_annotation = None

    def __getattr__(self, name: str) -> Any:
        if name == "activity_type":
            raise AttributeError(name)
        return getattr(self._event, name)


def _cpu_events() -> list[Any]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    x = torch.randn(4, 8, requires_grad=True)
    activities = [ProfilerActivity.CPU]
    with profile(activities=activities, profile_memory=True) as prof, record_function(ITERATION):
        with record_function(phase_range("forward")):
            loss = model(x).sum()
        loss.backward()
    return list(prof.profiler.kineto_results.events())


@pytest.mark.parametrize("annotation_flag", [True, False])
def test_the_derived_kind_of_every_cpu_event_is_torchs_own(annotation_flag: bool) -> None:
    events = _cpu_events()
    kinds = {e.activity_type() for e in events}
    assert {"cpu_op", "user_annotation", "cpu_instant_event"} <= kinds
    for event in events:
        seen = WithoutActivityType(event, annotation_flag)
        theirs = event.activity_type() == "user_annotation" and not event.name().startswith("fx")
        if theirs and not annotation_flag:
            continue  # torch's own ranges need the flag; fxtune's are known by name
        assert activity_kind(seen) == event.activity_type(), event.name()


def _fake(name: str, device: str) -> Any:
    kind = SimpleNamespace(name=device.upper())
    return SimpleNamespace(
        name=lambda: name, device_type=lambda: kind, is_user_annotation=lambda: False
    )


@pytest.mark.parametrize(
    ("name", "device", "kind"),
    [
        ("void at::native::vectorized_elementwise_kernel<4>", "cuda", "kernel"),
        ("Memcpy HtoD (Pageable -> Device)", "cuda", "gpu_memcpy"),
        ("Memset (Device)", "cuda", "gpu_memset"),
        ("cudaLaunchKernel", "cpu", "cuda_runtime"),
        ("cudaGraphLaunch", "cpu", "cuda_runtime"),
        ("cuLaunchKernel", "cpu", "cuda_driver"),
        ("aten::addmm", "cpu", "cpu_op"),
    ],
)
def test_cuda_events_are_told_apart_by_device_and_name(name: str, device: str, kind: str) -> None:
    assert activity_kind(_fake(name, device)) == kind


def test_function_events_without_activity_type_are_classified_as_on_torch_2_11() -> None:
    """torch 2.11's FunctionEvent has no `activity_type` (the GPU image's torch): every tuning
    run's profile failed there. Real events of this torch, with the attribute removed, must be
    classified as they are with it."""
    with profile(activities=[ProfilerActivity.CPU]) as prof, record_function("fxtune.mark"):
        torch.randn(8, 8) @ torch.randn(8, 8)
    events = list(prof.events())
    with_type = [(e.name, function_event_kind(e), is_op_event(e)) for e in events]
    for e in events:
        del e.activity_type
    without = [(e.name, function_event_kind(e), is_op_event(e)) for e in events]
    assert without == with_type and ("aten::mm", "cpu_op", True) in without
    assert ("fxtune.mark", "user_annotation", False) in without
    runtime = SimpleNamespace(name="cudaLaunchKernel", is_user_annotation=False)
    assert function_event_kind(runtime) == "cuda_runtime"
