"""How much of this machine's CPU other work holds, sampled from /proc/stat.

A time budget is a promise in wall-clock seconds, but a compile's seconds depend on the cores it
gets: with two busy processes on two cores, an AOTInductor compile of ResNet-18 took about twice
its quiet time, and a run that planned with the quiet figure started compiles that could not
finish. So a run samples the load once, before it starts anything: compile times are kept as
what a quiet machine would take (`tuner.backends.compile_time`) and scaled by the run's
`slowdown` when it plans. Where /proc/stat cannot be read, the machine counts as quiet.

Where the cores are shared, a second sample prices compiles in a child: the tuner starts each
AOTInductor build in a process of its own session (`tuner.backends.isolation`), and where the
kernel groups processes by session (Linux's autogroup) such a child gets a group's share of the
cores, not a process's. Beside two busy processes of the tuner's own session on two cores,
children built ResNet-18 and EfficientNet-B0 in about their quiet time (20.5 and 27.9 s against
18.9 and 28.7 s) while the fair-share figure said twice that; beside two busy processes each in a
session of its own, a spinning child got 0.5-0.74 of a core. So the share a child gets is
measured (`child_core_share`), not derived.

The same sample picks `fxtune tune`'s default thread count (`threads_beside`): torch's
multi-threaded kernels wait at each op for their slowest thread, and a thread that other work
has descheduled stalls them all. With two busy processes on two cores, MobileNet-V2 took
317-430 ms per call on two threads and 105-115 ms on one, and an EfficientNet-B0 output check
that takes 2 s on a quiet machine took 65 s.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

STAT = Path("/proc/stat")
SAMPLE_S = 0.2  # long enough for 20 clock ticks per core at Linux's 100 Hz
CHILD_SAMPLE_S = 0.3
# A child that spins for `window` seconds and prints the share of one core it got.
_SPIN = (
    "import time\n"
    "w, c = time.monotonic(), time.process_time()\n"
    "while time.monotonic() - w < {window}: pass\n"
    "print((time.process_time() - c) / (time.monotonic() - w))"
)


# Other work holding this share of the cores makes the machine shared (`CoreLoad.shared`).
BUSY_SHARE = 0.25


@dataclass(frozen=True)
class CoreLoad:
    """`busy` of the `cores` this process may run on were kept busy by other work."""

    cores: int
    busy: float = 0.0
    child_share: float = 1.0  # of one core, got by a process in a session of its own

    @property
    def slowdown(self) -> float:
        """How many times longer work wanting every core takes than on a quiet machine: the
        cores are shared fairly between this run's `cores` threads and the `busy` others."""
        return (self.cores + self.busy) / self.cores

    @property
    def child_slowdown(self) -> float:
        """How many times longer a compile in a child (a session of its own, about one core's
        work) takes than on a quiet machine: one over the share of a core such a process got,
        never above `slowdown`."""
        return min(max(1.0 / max(self.child_share, 1e-3), 1.0), self.slowdown)

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

    def describe_compiles(self) -> str:
        """What the load does to compiles, for the report."""
        return (
            f"compiles in this process are expected to take {self.slowdown:.1f}x as long as on "
            f"a quiet machine, in a child {self.child_slowdown:.1f}x (a child of its own session "
            f"got {self.child_share:.2f} of a core)"
        )


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
    load = CoreLoad(len(cores), round(busy, 2))
    if not load.shared:
        return load
    return dataclasses.replace(load, child_share=round(child_core_share(), 3))


def child_core_share(window_s: float = CHILD_SAMPLE_S) -> float:
    """The share of one core a process started in a session of its own (as the tuner starts
    its compile children) gets over `window_s`, while this process waits; 1.0 where it cannot
    be measured (the fair-share `slowdown` still bounds what a child is expected to take)."""
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _SPIN.format(window=window_s)],
            capture_output=True,
            text=True,
            timeout=10 * window_s + 10,
            start_new_session=True,
            env={},
        )
        return min(max(float(done.stdout.strip()), 0.0), 1.0)
    except (OSError, ValueError, subprocess.SubprocessError):
        return 1.0


def threads_beside(load: CoreLoad, wanted: int) -> int:
    """Threads to tune with beside the other work: `wanted`, or the cores it leaves free (at
    least one) where that is fewer."""
    free = max(1, int(load.cores - load.busy + 0.5))
    return max(1, min(wanted, free))
