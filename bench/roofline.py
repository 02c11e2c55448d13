"""The compute floor of a model on this machine: its matrix-multiply and convolution FLOPs at
the best rate torch's GEMM reaches here.

A speed goal over a peer is only worth chasing below the ceiling this floor sets: no float32
program of these FLOPs runs faster than `flops / peak`, whatever else it fuses or drops, so
`peer_s / floor_s` is the most any tuner can ship over that peer. Only GEMMs and convolutions
are counted (torch's `FlopCounterMode`; attention through SDPA's math form, whose matmuls it
counts): the floor is a lower bound on the time, the ceiling an upper bound on the speedup.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from tuner.graph.capture import example_inputs

# Square float32 GEMMs timed for the peak: on 2 AMD EPYC cores torch reached 205 GFLOP/s at
# 512, 193 at 1024 and 185 at 2048 (cache-resident blocks); all three stay within 2 s.
PEAK_SIZES = (512, 1024, 2048)
PEAK_REPEATS = 12


def gemm_peak_flops(sizes: tuple[int, ...] = PEAK_SIZES, repeats: int = PEAK_REPEATS) -> float:
    """FLOP/s of the fastest float32 `torch.mm` call seen, at this process's thread count.

    The fastest, not the median: the floor must be one no call can beat on this machine.
    """
    best = 0.0
    with torch.inference_mode():
        for n in sizes:
            a, b = torch.randn(n, n), torch.randn(n, n)
            torch.mm(a, b)
            for _ in range(repeats):
                started = time.perf_counter()
                torch.mm(a, b)
                best = max(best, 2 * n**3 / (time.perf_counter() - started))
    return best


def program_flops(program: ExportedProgram) -> int:
    """The GEMM and convolution FLOPs of one call of `program` on its example inputs."""
    module = program.module()
    counter = FlopCounterMode(display=False)
    with sdpa_kernel([SDPBackend.MATH]), torch.inference_mode(), counter:
        module(*example_inputs(program))
    return counter.get_total_flops()


def add_floors(rows: list[dict[str, Any]], peak_flops: float) -> None:
    """Each row's `flops` (from `program_flops`) becomes its `roofline`: the FLOPs, the peak
    they were divided by (the best of the run's measurements) and the floor."""
    for row in rows:
        flops = row.pop("flops", None)
        if flops is not None:
            row["roofline"] = {
                "gflop": round(flops / 1e9, 4),
                "peak_gflops": round(peak_flops / 1e9, 1),
                "floor_ms": round(flops / peak_flops * 1e3, 4),
            }
