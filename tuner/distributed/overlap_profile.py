"""How much communication a step hides: the seed's figure 5 (sequential vs overlapped) in numbers.

Three figures are measured on every rank in lockstep (`tuner.distributed.lockstep`), nothing is
modelled:

- comm alone: the program's collectives (same sizes, same group) issued and waited for with
  nothing else running: what the communication costs when it is fully exposed;
- blocked time: in a copy of a program whose request and wait calls are wrapped with a clock,
  the time each step spends inside them (issuing + waiting). In the sequential program that is
  the whole communication; in the overlapped one only the part compute did not cover;
- step time of the sequential and the overlapped program (from the A/B timing).

Hidden communication is then reported two ways that should roughly agree: the step-time saving
(sequential - overlapped) and the blocked-time saving (blocked sequential - blocked
overlapped), each also as a share of comm alone, and the step-time saving as a share of the
communication the sequential step exposes (blocked time: the transfer plus waiting for a slower
peer, which overlapping hides too, so a share of comm alone can exceed 100 %). Compute is step
time minus blocked time.
torch.profiler was not used: it adds per-op overhead of the same order as the small CPU ops
here, and it records the collective's CPU-side calls, which is what the clock wrappers measure
anyway at one function call of cost.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from tuner.graph.copying import deep_copy
from tuner.passes.overlap_comm_compute import STARTS, WAIT

_c10d = torch.ops._c10d_functional
_RECORD: dict[str, float] = {"request_s": 0.0, "wait_s": 0.0}


def timed_all_to_all_single(
    x: torch.Tensor, output_split_sizes: Any, input_split_sizes: Any, group_name: str
) -> torch.Tensor:
    """`all_to_all_single` with the time spent issuing it added to the step's blocked time."""
    started = time.perf_counter_ns()
    out = _c10d.all_to_all_single(x, output_split_sizes, input_split_sizes, group_name)
    _RECORD["request_s"] += (time.perf_counter_ns() - started) / 1e9
    return out


def timed_wait_tensor(x: torch.Tensor) -> torch.Tensor:
    """`wait_tensor` with the time spent waiting added to the step's blocked time."""
    started = time.perf_counter_ns()
    out = _c10d.wait_tensor(x)
    _RECORD["wait_s"] += (time.perf_counter_ns() - started) / 1e9
    return out


def instrumented(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of `gm` whose all-to-all requests and waits run through the clock wrappers."""
    copied = deep_copy(gm)
    for node in copied.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is _c10d.all_to_all_single.default:
            node.target = timed_all_to_all_single
        elif node.target is WAIT:
            node.target = timed_wait_tensor
    copied.recompile()
    return copied


def blocked_per_step(step: Callable[[], Any], steps: int) -> tuple[list[float], list[float]]:
    """Seconds inside the requests and inside the waits, per step (collective: every rank).

    The request's own time tells whether the backend runs the collective asynchronously: if
    issuing it took as long as the whole exchange, nothing could be hidden behind compute.
    On CUDA these are host-side times (a wait only orders streams); use step times there.
    """
    import torch.distributed as dist

    requests, waits = [], []
    with torch.inference_mode():
        for _ in range(steps):
            dist.barrier()
            _RECORD["request_s"] = _RECORD["wait_s"] = 0.0
            step()
            requests.append(_RECORD["request_s"])
            waits.append(_RECORD["wait_s"])
    return requests, waits


def comm_alone(gm: fx.GraphModule, device: str = "cpu") -> Callable[[], Any] | None:
    """The program's all-to-alls on zero tensors of their recorded shapes, one after another."""
    calls = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in STARTS:
            fake = node.args[0].meta["val"]
            x = torch.zeros(fake.shape, dtype=fake.dtype, device=device)
            calls.append((x, *node.args[1:]))
    if not calls:
        return None

    def run() -> None:
        for x, out_splits, in_splits, group in calls:
            _c10d.wait_tensor(_c10d.all_to_all_single(x, out_splits, in_splits, group))

    return run


def breakdown(
    sequential_s: float,
    overlapped_s: float,
    comm_alone_s: float,
    blocked_sequential_s: float,
    blocked_overlapped_s: float,
    request_sequential_s: float = float("nan"),
) -> dict[str, Any]:
    """Figure 5 in numbers (microseconds and shares); inputs are medians in seconds."""
    us = 1e6
    hidden_step = sequential_s - overlapped_s
    hidden_blocked = blocked_sequential_s - blocked_overlapped_s

    def share(x: float) -> float | None:
        return round(x / comm_alone_s, 4) if comm_alone_s > 0 else None

    return {
        "sequential_step_us": round(sequential_s * us, 1),
        "overlapped_step_us": round(overlapped_s * us, 1),
        "comm_alone_us": round(comm_alone_s * us, 1),
        "compute_us": round((sequential_s - blocked_sequential_s) * us, 1),
        "blocked_sequential_us": round(blocked_sequential_s * us, 1),
        "request_sequential_us": round(request_sequential_s * us, 1),
        "blocked_overlapped_us": round(blocked_overlapped_s * us, 1),
        "hidden_by_step_time_us": round(hidden_step * us, 1),
        "hidden_by_step_time_share": share(hidden_step),
        "hidden_by_blocked_time_us": round(hidden_blocked * us, 1),
        "hidden_by_blocked_time_share": share(hidden_blocked),
        # Comm as the sequential step really exposes it: transfer plus waiting for the slower
        # peer (load skew), which overlap also hides; so hidden / comm alone can exceed 1.
        "hidden_by_step_time_share_of_exposed": (
            round(hidden_step / blocked_sequential_s, 4) if blocked_sequential_s > 0 else None
        ),
    }


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")
