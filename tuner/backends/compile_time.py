"""How long a compile will take, from compiles measured before on the same hardware.

A tuning budget is only a limit if a compile that cannot finish in what is left is never
started. Compile time is mostly fixed cost (starting a child, inductor's setup, the C++ compile
of kernels and wrapper: an AOTInductor compile in a child of ResNet-18's 192 nodes took 19 s
here, of EfficientNet-B0's 602 nodes 29 s) and grows slowly with the graph, so the estimate scales
the measured compile nearest in size by the square root of the node-count ratio. Measurements
(including lower bounds: compiles stopped for overrunning) are kept per (hardware key, backend)
in a JSON file next to the decision cache, as what a quiet machine would take: a run divides
what it measured by its slowdown for that backend (`tuner.host.load`: the cores' fair share for
a compile in this process, the share of a core a child got for a compile in a child) and
multiplies its estimates by it.
With nothing measured yet for a backend there is no estimate, only a prior to plan with
(`PRIORS`), and the first compile runs: an AOTInductor compile runs in a child process that is
stopped when it overruns, so even that one cannot overrun the budget far.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path

from tuner.host.files import write_json
from tuner.host.job_caches import COMPILE_TIMES, KEPT_COMPILES

KEPT = KEPT_COMPILES  # measurements kept per key, newest last (a job's merge keeps as many)

# Before anything is measured on a machine, per backend: (fixed seconds, seconds per node), as
# measured on this project's 2-core CPU (torch 2.13, a quiet machine).
# AOTInductor, in a child whose precompiled headers are this process's (`tuner.backends.
# isolation`): zoo models of 192-602 nodes 17-29 s, the child's start and torch import included
# (before the headers were shared, every build remade them: 33-61 s). A machine's first build
# also makes the headers (12 s) and, in an empty inductor cache, probes the compiler (7 s); it is
# stopped if it overruns, and what it measured plans the next.
# torch.compile, on its first call: transformers of 100-250 nodes 3-10 s, ResNet-18 22 s, CNNs
# of 300-650 nodes 18-43 s. How a run plans with them, and when it starts a compile on a prior's
# word, is `tuner.tuning.budget`'s (`IN_PROCESS_MARGIN`, `STOPPABLE_SHARE`).
# The export of a dynamic program's dispatching program (`tuner.tuning.bucketing`), in this
# process: DistilBERT's and a recommendation model's of two and three buckets (318-759 nodes)
# 4-12 s.
# OpenVINO and ONNX Runtime: their artifact written in the run's serving child
# (`tuner.backends.isolation.Children.serve`), started as the run begins: a small graph 0.4-0.6 s,
# zoo models of 150-260 nodes 2-6 s (the conversion or export, and loading the result once).
PRIORS: dict[str, tuple[float, float]] = {
    "inductor": (18.0, 0.02),
    "openvino": (2.0, 0.015),
    "onnxruntime": (2.0, 0.02),
    "compile": (5.0, 0.06),
    "dispatch-export": (0.5, 0.015),
}
PRIOR_OTHER = (40.0, 0.05)  # a compiling backend with no prior of its own


FILE_NAME = COMPILE_TIMES


class CompileTimes:
    """Measured compiles per (hardware key, backend); `path` None keeps them in memory.

    `slowdown` is this run's: how many times longer than on a quiet machine its compiles are
    expected to take (1.0: quiet); `slowdowns` the same per backend where a backend's differs
    (one that compiles in a child). With `record_to`, `path` is only read and the keys this run
    measured are written to `record_to` (a worker's job: `JsonDecisionCache` says why)."""

    def __init__(
        self,
        path: Path | None,
        slowdown: float = 1.0,
        slowdowns: Mapping[str, float] | None = None,
        record_to: Path | None = None,
    ) -> None:
        self.path = path
        self.record_to = record_to
        self._new: dict[str, list[list[float]]] = {}  # this run's, for `record_to`
        self.slowdown = max(slowdown, 1.0)
        self.slowdowns = {b: max(s, 1.0) for b, s in (slowdowns or {}).items()}
        self._rates: dict[str, list[list[float]]] = {}
        if path is not None and path.exists():
            try:
                self._rates = json.loads(path.read_text())
            except (OSError, ValueError):
                self._rates = {}  # a corrupt file only costs an estimate

    @staticmethod
    def for_cache(
        cache_path: Path | None,
        slowdown: float = 1.0,
        slowdowns: Mapping[str, float] | None = None,
        record_to: Path | None = None,
    ) -> CompileTimes:
        """The store beside a decision cache file (same folder), or in memory without one;
        `record_to`: the folder this run's measurements go to instead."""
        path = None if cache_path is None else cache_path.with_name(FILE_NAME)
        out = None if record_to is None else record_to / FILE_NAME
        return CompileTimes(path, slowdown, slowdowns, out)

    def slowdown_of(self, backend: str) -> float:
        return self.slowdowns.get(backend, self.slowdown)

    def samples(self, hardware: str, backend: str) -> list[tuple[int, float]]:
        entry = self._rates.get(f"{hardware}::{backend}")
        if isinstance(entry, list) and entry:
            return [(int(n), float(t)) for n, t in entry]
        return []

    def estimate(self, hardware: str, backend: str, nodes: int) -> float | None:
        measured = self.samples(hardware, backend)
        if not measured:
            return None
        # Of equally near sizes, the newest: the machine's caches and load change.
        n, seconds = min(
            reversed(measured), key=lambda s: abs(math.log(max(s[0], 1) / max(nodes, 1)))
        )
        return self.slowdown_of(backend) * seconds * math.sqrt(max(nodes, 1) / max(n, 1))

    def planning_estimate(self, hardware: str, backend: str, nodes: int) -> tuple[float, bool]:
        """(seconds, measured): the estimate from this machine's compiles, else the prior."""
        measured = self.estimate(hardware, backend, nodes)
        if measured is not None:
            return measured, True
        fixed, per_node = PRIORS.get(backend, PRIOR_OTHER)
        return self.slowdown_of(backend) * (fixed + per_node * nodes), False

    def record(self, hardware: str, backend: str, nodes: int, seconds: float) -> None:
        """A compile of `nodes` nodes took `seconds` (or at least that long, if stopped), kept
        as what it would have taken on a quiet machine."""
        key = f"{hardware}::{backend}"
        quiet = round(seconds / self.slowdown_of(backend), 3)
        self._rates[key] = [*self._rates.get(key, []), [nodes, quiet]][-KEPT:]
        self._new[key] = [*self._new.get(key, []), [nodes, quiet]][-KEPT:]
        self._save()

    def record_stopped(self, hardware: str, backend: str, nodes: int, seconds: float) -> None:
        """A compile stopped after `seconds`: a lower bound, kept only where it says more than
        what is expected already (a compile stopped after 1 s, when 40 s were expected, says
        nothing of its length, and kept it would let the next run start compiles that cannot
        finish)."""
        expected, _ = self.planning_estimate(hardware, backend, nodes)
        if seconds > expected:
            self.record(hardware, backend, nodes, seconds)

    def _save(self) -> None:
        if self.record_to is not None:
            # Only this run's: the caller appends them to the store this run read (a job's
            # snapshot), which already holds the rest.
            write_json(self.record_to, {k: self._new[k] for k in sorted(self._new)})
        elif self.path is not None:
            write_json(self.path, self._rates)
