"""Where the model's time goes, node by node: the profile that decides where to search.

MAIProf's point is to measure before optimising and spend the effort where the time is. The
site search (`tuner.search.site_search`) asks this profile for each site's share of the model's
time: it measures the sites that cover the most time first, so a short budget goes where it can
matter, and it does not time a site whose whole share is below the noise a whole-model comparison
can resolve (rewriting it could not change a verdict).

The profile runs the graph module node by node (`fx.Interpreter`), timing each node with the
device synchronised after it, a few times; a node's time is its median. Interpreting adds a few
microseconds per node, the same for every node, so shares are slightly flattened, never
reordered by more than that.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from tuner.contract.device import Device

RUNS = 3
# The nodes that do work; placeholders, attribute reads and the output cost only the interpreter.
WORK = ("call_function", "call_method", "call_module")


@dataclass(frozen=True)
class NodeProfile:
    """Seconds per call of each node (by name) and of the whole interpreted run."""

    seconds: dict[str, float] = field(default_factory=dict)
    total_s: float = 0.0

    def share(self, names: Iterable[str]) -> float | None:
        """The named nodes' share of the model's time; None when one is not in the profile (it
        was made by a rewrite after the profile was taken)."""
        if self.total_s <= 0:
            return None
        spent = 0.0
        for name in names:
            t = self.seconds.get(name)
            if t is None:
                return None
            spent += t
        return spent / self.total_s


class _TimedInterpreter(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, sync: Callable[[], None]) -> None:
        super().__init__(gm)
        self.sync = sync
        self.times: dict[str, float] = {}

    def run_node(self, n: fx.Node) -> Any:
        start = time.perf_counter()
        out = super().run_node(n)
        self.sync()
        self.times[n.name] = time.perf_counter() - start
        return out


def _sync(device: Device) -> Callable[[], None]:
    if device.kind == "cuda":
        return lambda: torch.cuda.synchronize(device.torch_device)
    return lambda: None


def profile_nodes(
    gm: fx.GraphModule, inputs: tuple, device: Device, runs: int = RUNS
) -> NodeProfile:
    """Median seconds per node over `runs` interpreted calls (after one warm-up call)."""
    sync = _sync(device)
    per_run: list[dict[str, float]] = []
    with torch.inference_mode():
        for i in range(runs + 1):
            interp = _TimedInterpreter(gm, sync)
            interp.run(*inputs)
            if i:  # the first call warms caches and allocators
                per_run.append(interp.times)
    work = {
        n.name: statistics.median(r.get(n.name, 0.0) for r in per_run)
        for n in gm.graph.nodes
        if n.op in WORK
    }
    return NodeProfile(work, sum(work.values()))
