"""Does gloo run an all-to-all in the background? Time the request, compute, and the wait.

If the request call returned only after the exchange, nothing could hide behind compute. This
measures, per rank and payload: the time inside `all_to_all_single` (the request), a fixed
compute (3 matmuls of n x n), and the time inside `wait_tensor` afterwards, against the wait
with no compute in between. Medians of 50 barrier-aligned steps after 10 warm-up steps.
Writes bench/out/gloo_async.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tuner.distributed.ranks import run_ranks

_c10d = torch.ops._c10d_functional


def _steps(rank: int, world_size: int, numel: int, n: int) -> dict[str, float]:
    x = torch.randn(numel)
    splits = [numel // world_size] * world_size
    a = torch.randn(n, n)
    parts: dict[str, list[float]] = {"request_us": [], "compute_us": [], "wait_us": []}
    for i in range(60):
        dist.barrier()
        t0 = time.perf_counter_ns()
        handle = _c10d.all_to_all_single(x, splits, splits, dist.group.WORLD.group_name)
        t1 = time.perf_counter_ns()
        for _ in range(3 if n else 0):
            a @ a
        t2 = time.perf_counter_ns()
        _c10d.wait_tensor(handle)
        t3 = time.perf_counter_ns()
        if i >= 10:
            parts["request_us"].append((t1 - t0) / 1e3)
            parts["compute_us"].append((t2 - t1) / 1e3)
            parts["wait_us"].append((t3 - t2) / 1e3)
    return {k: round(statistics.median(v), 1) for k, v in parts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--out", type=Path, default=Path("bench/out/gloo_async.json"))
    args = parser.parse_args(argv)
    rows = []
    for ws in (int(w) for w in args.world_sizes.split(",")):
        for numel in (1 << 14, 1 << 18, 1 << 20):
            for n in (0, 256):
                per_rank = run_ranks(_steps, ws, numel, n, backend="gloo")
                rows.append(
                    {"world_size": ws, "bytes": numel * 4, "matmul_n": n, "ranks": per_rank}
                )
                print(json.dumps(rows[-1]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
