"""How long a compile will take, from compiles measured before on the same hardware.

A tuning budget is only a limit if a compile that cannot finish in what is left is never
started. Compile time is mostly fixed cost (starting a child, inductor's setup, the C++ compile
of the wrapper: a 45-node CNN and a 461-node recommender took 19 s and 28 s here) and grows
slowly with the graph, so the estimate scales the measured compile nearest in size by the square
root of the node-count ratio. Measurements (including lower bounds: compiles stopped for
overrunning) are kept per (hardware key, backend) in a JSON file next to the decision cache.
With nothing measured yet there is no estimate and the first compile runs: an AOTInductor
compile runs in a child process that is stopped when it overruns, so even that one cannot
overrun the budget far.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

# torch.compile has no record of its own until it has run once; the AOTInductor rate of the
# same hardware stands in for it (both lower through inductor).
STAND_INS = {"compile": "inductor"}


KEPT = 8  # measurements kept per key, newest last

# Before anything is measured on a machine: an AOTInductor compile on CPU as measured on 2 cores
# (torch 2.13; CPU time of the child, cold inductor cache): a 45-node CNN 19 s, a 244-node DLRM
# and a 461-node recommender about 28 s, a 602-node EfficientNet-B0 31 s. Only for planning (do
# the peers go first?), never to skip a compile: a machine twice as fast would lose its peers.
PRIOR_FIXED_S = 15.0
PRIOR_PER_NODE_S = 0.03


class CompileTimes:
    """Measured compiles per (hardware key, backend); `path` None keeps them in memory."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._rates: dict[str, list[list[float]]] = {}
        if path is not None and path.exists():
            try:
                self._rates = json.loads(path.read_text())
            except (OSError, ValueError):
                self._rates = {}  # a corrupt file only costs an estimate

    @staticmethod
    def for_cache(cache_path: Path | None) -> CompileTimes:
        """The store beside a decision cache file (same folder), or in memory without one."""
        if cache_path is None:
            return CompileTimes(None)
        return CompileTimes(cache_path.with_name("compile_times.json"))

    def samples(self, hardware: str, backend: str) -> list[tuple[int, float]]:
        for name in (backend, STAND_INS.get(backend)):
            entry = self._rates.get(f"{hardware}::{name}") if name else None
            if isinstance(entry, list) and entry:
                return [(int(n), float(t)) for n, t in entry]
        return []

    def estimate(self, hardware: str, backend: str, nodes: int) -> float | None:
        measured = self.samples(hardware, backend)
        if not measured:
            return None
        n, seconds = min(measured, key=lambda s: abs(math.log(max(s[0], 1) / max(nodes, 1))))
        return seconds * math.sqrt(max(nodes, 1) / max(n, 1))

    def planning_estimate(self, hardware: str, backend: str, nodes: int) -> tuple[float, bool]:
        """(seconds, measured): the estimate from this machine's compiles, else the prior."""
        measured = self.estimate(hardware, backend, nodes)
        if measured is not None:
            return measured, True
        return PRIOR_FIXED_S + PRIOR_PER_NODE_S * nodes, False

    def record(self, hardware: str, backend: str, nodes: int, seconds: float) -> None:
        """A compile of `nodes` nodes took `seconds` (or at least that long, if stopped)."""
        key = f"{hardware}::{backend}"
        self._rates[key] = [*self._rates.get(key, []), [nodes, seconds]][-KEPT:]
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".compile_times-")
        with os.fdopen(fd, "w") as f:
            json.dump(self._rates, f, indent=1)
        os.replace(tmp, self.path)
