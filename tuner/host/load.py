"""How much of this machine's CPU other work holds, sampled from /proc/stat.

A time budget is a promise in wall-clock seconds, but a compile's seconds depend on the cores it
gets: with two busy processes on two cores, an AOTInductor compile of ResNet-18 took about twice
its quiet time, and a run that planned with the quiet figure started compiles that could not
finish. So a run samples the load once, before it starts anything: compile times are kept as
what a quiet machine would take (`tuner.backends.compile_time`) and scaled by the run's
`slowdown` when it plans. Where /proc/stat cannot be read, the machine counts as quiet.

The same sample picks `fxtune tune`'s default thread count (`threads_beside`): torch's
multi-threaded kernels wait at each op for their slowest thread, and a thread that other work
has descheduled stalls them all. With two busy processes on two cores, MobileNet-V2 took
317-430 ms per call on two threads and 105-115 ms on one, and an EfficientNet-B0 output check
that takes 2 s on a quiet machine took 65 s.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

STAT = Path("/proc/stat")
SAMPLE_S = 0.2  # long enough for 20 clock ticks per core at Linux's 100 Hz


# Other work holding this share of the cores makes the machine shared (`CoreLoad.shared`).
BUSY_SHARE = 0.25


@dataclass(frozen=True)
class CoreLoad:
    """`busy` of the `cores` this process may run on were kept busy by other work."""

    cores: int
    busy: float = 0.0

    @property
    def slowdown(self) -> float:
        """How many times longer work wanting every core takes than on a quiet machine: the
        cores are shared fairly between this run's `cores` threads and the `busy` others."""
        return (self.cores + self.busy) / self.cores

    @property
    def busy_share(self) -> float:
        return self.busy / self.cores

    @property
    def shared(self) -> bool:
        """Enough other work that the report says so and CPU timing on one thread switches to
        CPU time (`tuner.measure.timing.Clock`)."""
        return self.busy_share >= BUSY_SHARE

    def describe(self) -> str:
        return f"{self.busy:.1f} of {self.cores} cores busy with other work"


def _cores() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _ticks(cores: set[int]) -> tuple[float, float, int] | None:
    """(busy ticks, all ticks) summed over `cores`, and the runnable threads right now."""
    try:
        lines = STAT.read_text().splitlines()
    except OSError:
        return None
    busy = total = 0.0
    running = 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            fields = [float(v) for v in rest.split()[:8]]  # user nice system idle iowait irq ...
            idle = fields[3] + fields[4]
            total += sum(fields)
            busy += sum(fields) - idle
        elif name == "procs_running":
            running = int(rest.strip() or 0)
    return busy, total, running


def sample_load(window_s: float = SAMPLE_S) -> CoreLoad:
    """The other work on this process's cores over `window_s`, while this process sleeps.

    Busy time cannot exceed the cores, so more runnable threads than cores (the fewer of two
    counts, at either end of the window, this process excluded) raise the figure to the queue
    they make.
    """
    cores = _cores()
    first = _ticks(cores)
    time.sleep(window_s)
    last = _ticks(cores)
    if first is None or last is None or last[1] <= first[1]:
        return CoreLoad(len(cores))
    share = (last[0] - first[0]) / (last[1] - first[1])
    queued = max(min(first[2], last[2]) - 1, 0)  # procs_running counts this process
    busy = max(share * len(cores), min(float(queued), 4.0 * len(cores)))
    return CoreLoad(len(cores), round(busy, 2))


def threads_beside(load: CoreLoad, wanted: int) -> int:
    """Threads to tune with beside the other work: `wanted`, or the cores it leaves free (at
    least one) where that is fewer."""
    free = max(1, int(load.cores - load.busy + 0.5))
    return max(1, min(wanted, free))
