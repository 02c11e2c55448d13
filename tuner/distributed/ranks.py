"""Running one function on N ranks of a real process group on this machine, and never hanging.

fxtune starts the ranks itself (no torchrun): one process per rank, a TCPStore hosted by the
launcher on loopback, gloo on CPU or NCCL with one GPU per rank. The ranks are forked by
multiprocessing's fork server, a fresh process that imported torch once and nothing else ran
in (no threads, no CUDA context to inherit): a spawned rank paid two seconds of CPU importing
torch, at every launch. What can go wrong with ranks is that one dies and the others wait for
it forever, or that the launcher dies and leaves ranks behind. So:

- every collective has a timeout (`init_process_group(timeout=...)`), so a rank waiting for a
  dead peer fails instead of blocking;
- every rank ends when its launcher does (a thread waits on the launcher's multiprocessing
  sentinel), so a killed launcher leaves no rank running;
- the launcher watches every rank's exit and result; the first failure (an exception, a signal,
  a non-zero exit) stops the job: the other ranks are terminated, then killed, then reaped,
  and `RankFailedError` says which rank failed and why. A whole-job deadline bounds the rest.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import pickle
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from multiprocessing.context import BaseContext
from typing import Any

import torch
import torch.distributed as dist

from tuner.contract.errors import RankFailedError

log = logging.getLogger("fxtune.distributed")

_GRACE_S = 3.0
_SETTLE_S = 1.0


@dataclass(frozen=True)
class Group:
    """How the ranks meet: backend, size, the launcher's store and the per-collective timeout."""

    world_size: int
    backend: str = "gloo"
    collective_timeout_s: float = 60.0
    store_port: int = 0
    threads: int | None = 1


def default_backend() -> str:
    """NCCL when there is one GPU per rank to give, else gloo (CPU over loopback)."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def _die_with_launcher() -> None:
    """End this rank when the launcher goes, however it goes (SIGKILL included).

    Its parent is the fork server, which outlives a killed launcher while any rank runs (each
    holds the server's keep-alive pipe), so `PR_SET_PDEATHSIG` is not enough. multiprocessing
    gives every child a sentinel that becomes ready when the process that started it is gone:
    a daemon thread waits on it and ends the process."""
    launcher = mp.parent_process()
    if launcher is None:
        return

    def watch() -> None:
        wait([launcher.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="fxtune-launcher-watch", daemon=True).start()


# A Unix socket's path holds at most 107 bytes; the fork server's is
# "$TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX" (multiprocessing's temporary folder, then its name).
_SOCKET_PATH_MAX = 107
_SERVER_SOCKET = len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def _rank_context() -> BaseContext:
    """multiprocessing's fork server, torch imported in it before its first fork; spawn where
    the server's socket cannot be made (its path, in this process's temporary folder, would be
    too long: a job folder deep in a worker's data folder). The preload applies to the server
    this process starts (one per process, started on first use)."""
    if len(os.fsencode(tempfile.gettempdir())) + _SERVER_SOCKET > _SOCKET_PATH_MAX:
        log.debug("ranks are spawned: a fork server's socket path would be too long")
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    group: Group,
    environment: dict[str, str],
    conn: Connection,
    args: tuple[Any, ...],
) -> None:
    _die_with_launcher()
    os.environ.clear()  # the launcher's, as a spawned rank saw it (the server's is older)
    os.environ.update(environment)
    if group.threads is not None:
        torch.set_num_threads(group.threads)
    timeout = timedelta(seconds=group.collective_timeout_s)
    try:
        store = dist.TCPStore(
            "127.0.0.1", group.store_port, group.world_size, is_master=False, timeout=timeout
        )
        if group.backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            group.backend, store=store, rank=rank, world_size=group.world_size, timeout=timeout
        )
        result = fn(rank, group.world_size, *args)
        # Plain pickle, not the Pipe's ForkingPickler: that one would pass tensors as shared
        # memory handles that die with this process before the launcher reads them.
        conn.send_bytes(pickle.dumps(("ok", result)))
    except BaseException as exc:  # reported to the launcher, then this rank exits non-zero
        why = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
        conn.send_bytes(pickle.dumps(("error", why)))
        conn.close()
        os._exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    conn.close()


def _stop(processes: list[mp.process.BaseProcess]) -> None:
    """Terminate, then kill, then reap every rank still running: none is left behind."""
    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + _GRACE_S
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in processes:
        if p.is_alive():
            p.kill()
        p.join()


def run_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    collective_timeout_s: float = 60.0,
    job_timeout_s: float = 600.0,
    threads: int | None = 1,
) -> list[Any]:
    """Call `fn(rank, world_size, *args)` on every rank with the default group initialised.

    `fn` and `args` must be picklable (a module-level function): ranks are forked from the fork
    server, not from the launcher, so no rank inherits the launcher's threads or a
    half-initialised CUDA context; each gets the launcher's environment. Returns each
    rank's result, in rank order. Raises `RankFailedError` on the first failure, after stopping
    every rank. `threads` pins each rank's intra-op threads (ranks share the machine's cores).
    """
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    backend = backend or default_backend()
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise RankFailedError(f"NCCL needs {world_size} GPUs, found {torch.cuda.device_count()}")
    store = dist.TCPStore(
        "127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
        timeout=timedelta(seconds=collective_timeout_s),
    )  # fmt: skip
    group = Group(world_size, backend, collective_timeout_s, store.port, threads)
    ctx = _rank_context()
    environment = dict(os.environ)  # one snapshot for every rank
    processes: list[mp.process.BaseProcess] = []
    pipes: dict[Connection, int] = {}
    results: dict[int, Any] = {}
    try:
        for rank in range(world_size):
            receive, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_rank_main,
                args=(fn, rank, group, environment, send, args),
                name=f"fxtune-rank{rank}",
                daemon=True,
            )
            proc.start()
            send.close()
            processes.append(proc)
            pipes[receive] = rank
        deadline = time.monotonic() + job_timeout_s
        sentinels = {p.sentinel: r for r, p in enumerate(processes)}
        failures: dict[int, str] = {}
        settle_until = math.inf
        while len(results) < world_size and time.monotonic() < settle_until:
            left = min(deadline, settle_until) - time.monotonic()
            if left <= 0:
                break
            for ready in wait([*pipes, *sentinels], timeout=left):
                if ready in pipes:
                    rank = pipes.pop(ready)
                    try:
                        status, payload = pickle.loads(ready.recv_bytes())
                    except EOFError:
                        processes[rank].join(_GRACE_S)
                        status, payload = "died", processes[rank].exitcode
                    if status == "ok":
                        results[rank] = payload
                    else:
                        failures[rank] = _describe(rank, status, payload)
                else:
                    rank = sentinels.pop(ready)
                    processes[rank].join()
                    if (
                        rank not in results
                        and rank not in failures
                        and not _result_pending(pipes, rank)
                    ):
                        failures[rank] = _describe(rank, "died", processes[rank].exitcode)
            if failures and settle_until == math.inf:
                # Peers of a dead rank fail too, a moment later or sooner; wait briefly so the
                # report names the rank that died, not only the ones that lost it.
                settle_until = time.monotonic() + _SETTLE_S
        if failures:
            ordered = sorted(failures.items(), key=lambda kv: ("died" not in kv[1], kv[0]))
            raise RankFailedError("; ".join(why for _, why in ordered))
        if len(results) < world_size:
            raise RankFailedError(
                f"job deadline ({job_timeout_s:.0f} s) passed; ranks without a result: "
                f"{sorted(set(range(world_size)) - set(results))}"
            )
    finally:
        _stop(processes)
        for conn in pipes:
            conn.close()
        del store
    return [results[r] for r in range(world_size)]


def _describe(rank: int, status: str, payload: Any) -> str:
    if status == "died":
        return f"rank {rank} died (exit code {payload}) without a result"
    return f"rank {rank} failed: {payload}"


def _result_pending(pipes: dict[Connection, int], rank: int) -> bool:
    """Whether a rank that exited still has its result (or its error) waiting in the pipe."""
    return any(r == rank and conn.poll() for conn, r in pipes.items())
