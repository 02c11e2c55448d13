"""One tuning run's shared state, and the values passed between its steps.

Every step of the pipeline (capture, site search, candidates, judging, choosing, verifying,
the config) reads and adds to one `TuningRun`: the device and hardware it measures on, the
decision and compile-time stores, the clock of its budget, the sizes it tunes at, and what it
has timed. The steps themselves are in their own modules (`tuner.tuning.tuner` lists them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import fx

from tuner.backends.compile_time import CompileTimes
from tuner.backends.registry import BACKENDS, available_backends, builds_in_child
from tuner.contract.config import Figures, Verification
from tuner.contract.device import Device
from tuner.graph.capture import Inputs
from tuner.graph.shapes import ShapeSpec
from tuner.graph.sizes import SizePoint
from tuner.host.hardware import describe, hardware_key
from tuner.host.load import CoreLoad, sample_load
from tuner.measure.equivalence import ReferenceMemo
from tuner.measure.timing import Clock, require_timing, timing_clock
from tuner.passes.apply import Transformed
from tuner.search.decisions import DecisionCache, open_decision_cache
from tuner.tuning.candidates import Candidate
from tuner.tuning.options import TuneOptions

# The share of `budget_s` kept for what follows the last budget check: verification, writing
# the program and package, and the profiles (`tuner.tuning.outputs`).
FINISH_SHARE = 0.2


def to_device(x: Any, device: Device) -> Any:
    return x.to(device.torch_device) if isinstance(x, torch.Tensor) else x


@dataclass
class Captured:
    """The program as the tuner measures it: on the device, with the sizes it is tuned at."""

    gm: fx.GraphModule
    inputs: Inputs
    spec: ShapeSpec | None
    skipped: list[str]


@dataclass
class Verified:
    """What ships after verification: the chosen candidate, or the original when it failed."""

    figures: Figures
    candidate: Candidate
    replay: Transformed
    runner: Callable[..., Any]
    verification: Verification


@dataclass
class TuningRun:
    """A run's settings, stores and progress; `tuning_session` supplies its work folder."""

    options: TuneOptions
    device: Device
    hardware: dict[str, Any]
    hardware_key: str
    cache: DecisionCache
    compile_times: CompileTimes
    workdir: Path  # where compiled packages go (`tuning_session`)
    isolate: bool  # build compiled candidates in a child first (`TuneOptions.isolate_compiles`)
    load: CoreLoad  # other work on the cores as the run began (`tuner.host.load`)
    clock: Clock = "wall"  # what its CPU timings measure (`tuner.measure.timing.timing_clock`)
    started: float = field(default_factory=time.monotonic)
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    timed: int = 0  # comparisons made, sites and whole-model candidates together
    points: list[SizePoint] = field(default_factory=list)  # the example size first, then more
    model_time_s: float | None = None  # the original's seconds per call (CPU)
    spent: dict[str, float] = field(default_factory=dict)  # seconds per step (`clocked`)
    size_time_s: dict[str, float] = field(default_factory=dict)  # the same at further sizes
    peer_notes: list[str] = field(default_factory=list)  # what the peers were expected to cost
    candidates: list[Candidate] = field(default_factory=list)  # every one judged, once judged
    references: ReferenceMemo | None = None  # the original's outputs (`reference_memo`)

    @classmethod
    def open(cls, options: TuneOptions) -> TuningRun:
        """The run's state; refuses a device that cannot be timed, before anything else."""
        device = require_timing(Device.parse(options.device))
        if options.workdir is None:
            raise ValueError("Tuner needs a work folder: open a tuning_session(options) first")
        hardware = describe(device)
        load = options.load or sample_load()
        return cls(
            options=options,
            device=device,
            hardware=hardware,
            hardware_key=hardware_key(hardware),
            cache=open_decision_cache(options.cache_path, options.new_decisions_path),
            compile_times=CompileTimes.for_cache(
                options.cache_path,
                load.slowdown,
                {b: load.child_slowdown for b in BACKENDS if builds_in_child(b, options.isolates)},
                options.cache_out,
            ),
            workdir=options.workdir,
            isolate=options.isolates,
            load=load,
            clock=timing_clock(device, hardware["threads"], load.shared),
        )

    def reference_memo(self, gm0: Callable[..., Any]) -> ReferenceMemo:
        """The original's outputs per input set, computed once in the run: its candidates'
        checks, the verification, the size buckets and their dispatching program share them."""
        if self.references is None or self.references.reference is not gm0:
            self.references = ReferenceMemo(gm0)
        return self.references

    @contextmanager
    def clocked(self, step: str) -> Iterator[None]:
        """Adds the block's seconds to `spent[step]`: where the budget went, in the report
        (`tuning.seconds_by_step`), so a run that ran out of time says on what."""
        began = time.monotonic()
        try:
            yield
        finally:
            self.spent[step] = self.spent.get(step, 0.0) + time.monotonic() - began

    def remaining(self) -> float:
        """Seconds left for tuning proper (the finishing share of the budget excluded)."""
        usable = self.options.budget_s * (1 - FINISH_SHARE)
        return usable - (time.monotonic() - self.started)

    def budget_left(self) -> float:
        """Seconds until the whole budget is spent, the finishing share included."""
        return self.options.budget_s - (time.monotonic() - self.started)

    def timing_budget(self) -> float:
        """Seconds for one whole-model comparison: its own budget, within what is left."""
        return min(self.options.whole_model_budget_s, max(self.remaining(), 0.5))

    def backends(self) -> list[str]:
        """The backends asked for, or every one available for the device."""
        return self.options.backends or available_backends(self.device)

    def to_device(self, inputs: Inputs) -> Inputs:
        return tuple(to_device(x, self.device) for x in inputs)
