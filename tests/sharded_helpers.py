"""Shared by the distributed tests: a small sharded config, and rank functions (module level,
so spawned ranks can import them)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from examples.sharded import ShardedConfig, build, global_inputs, rank_inputs

# Small enough for a 2-core CI machine; 4 tables so that 1, 2 and 4 ranks all shard evenly.
SMALL = {
    "tables": 4,
    "rows": 1000,
    "dim": 32,
    "bag": 4,
    "batch": 256,
    "dense_in": 64,
    "hidden": 128,
}


def small(world_size: int) -> ShardedConfig:
    return ShardedConfig(world_size=world_size, **SMALL)


def build_small(out_dir: Path, world_size: int) -> str:
    """Export and save every rank's program on a real gloo group; returns the path pattern."""
    build(out_dir, small(world_size))
    return str(out_dir / "sharded_rank{rank}.pt2")


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but unreaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def record_pid(pid_dir: str, rank: int) -> None:
    """Written whole or not at all (a rename): a test polling the folder read an empty file."""
    partial = Path(pid_dir, f"rank{rank}.pid.partial")
    partial.write_text(str(os.getpid()))
    partial.rename(Path(pid_dir, f"rank{rank}.pid"))


def recorded_pids(pid_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in sorted(pid_dir.glob("rank*.pid"))]


def die_later(seconds: float) -> None:
    """SIGKILL this process after `seconds`, whatever it is doing (a rank lost mid-job)."""
    threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGKILL)).start()


def hang_in_collective(rank: int, world_size: int, pid_dir: str, victim: int) -> None:
    """Every rank loops on all-reduces; `victim` is killed in the middle of them."""
    record_pid(pid_dir, rank)
    if rank == victim:
        die_later(1.0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        t = torch.ones(1 << 16)
        dist.all_reduce(t)
    raise AssertionError("unreachable unless a collective hangs past the job's limits")


def tune_then_die(rank: int, world_size: int, model: str, options: Any, pid_dir: str) -> Any:
    """A distributed tuning job whose rank 1 is killed while its ranks time in lockstep.

    The kill is tied to the timing step, not to a clock: a fixed delay raced the job's end.
    """
    from tuner.distributed import tune as distributed_tune

    record_pid(pid_dir, rank)
    if rank == 1:
        timing = distributed_tune.lockstep_timing

        def timing_then_die(*args: Any, **kwargs: Any) -> Any:
            die_later(0.5)
            return timing(*args, **kwargs)

        distributed_tune.lockstep_timing = timing_then_die  # this rank's own process only
    return distributed_tune.tune_rank(rank, world_size, model, None, options)


def sleep_forever(rank: int, world_size: int, pid_dir: str) -> None:
    record_pid(pid_dir, rank)
    time.sleep(600)


__all__ = ["global_inputs", "rank_inputs"]
