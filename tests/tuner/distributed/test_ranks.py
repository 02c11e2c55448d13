"""The rank launcher: results from every rank, and no hang and no orphan when a rank dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.sharded_helpers import alive, hang_in_collective, recorded_pids
from tuner.distributed.ranks import RankFailedError, run_ranks


def gather_ranks(rank: int, world_size: int) -> tuple[int, list[float]]:
    t = torch.tensor([float(rank)])
    out = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(out, t)
    return dist.get_rank(), [float(x) for x in out]


def fail_on_rank_one(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank one refuses")
    dist.barrier()  # rank 0 waits on a peer that is gone


def test_every_rank_runs_on_a_real_group() -> None:
    assert run_ranks(gather_ranks, 2, backend="gloo") == [(0, [0.0, 1.0]), (1, [0.0, 1.0])]


def environment_and_parent(rank: int, world_size: int) -> tuple[str | None, int]:
    return os.environ.get("FXTUNE_TEST_RANK_ENV"), os.getppid()


def test_ranks_see_the_launcher_s_environment_as_it_is_at_each_launch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ranks are forked by a fork server started at the first launch: its own environment
    is that launch's, yet every launch's ranks see the launcher's as it is then."""
    monkeypatch.setenv("FXTUNE_TEST_RANK_ENV", "first")
    first = run_ranks(environment_and_parent, 2, backend="gloo")
    monkeypatch.setenv("FXTUNE_TEST_RANK_ENV", "second")
    second = run_ranks(environment_and_parent, 2, backend="gloo")
    assert [env for env, _ in first] == ["first", "first"]
    assert [env for env, _ in second] == ["second", "second"]
    servers = {parent for _, parent in first + second}
    assert len(servers) == 1 and os.getpid() not in servers  # one server forked them all


def test_where_the_fork_server_s_socket_path_would_be_too_long_the_ranks_are_spawned(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A worker's job folder (the tuning child's temporary folder) can be deep: a Unix
    socket's path holds 107 bytes, and the fork server failed to start under pytest's."""
    import tempfile

    from tuner.distributed import ranks

    deep = tmp_path / ("d" * 60) / ("e" * 40)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    assert ranks._rank_context().get_start_method() == "spawn"
    monkeypatch.setattr(tempfile, "tempdir", "/tmp")
    assert ranks._rank_context().get_start_method() == "forkserver"


def test_an_exception_on_one_rank_fails_the_job() -> None:
    started = time.monotonic()
    with pytest.raises(RankFailedError, match="rank 1 failed: ValueError: rank one refuses"):
        run_ranks(fail_on_rank_one, 2, backend="gloo", collective_timeout_s=20)
    assert time.monotonic() - started < 20  # stopped at once, not after the collective timeout


@pytest.mark.slow
def test_a_rank_killed_mid_collective_fails_cleanly_and_leaves_no_rank(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 died \(exit code -9\)"):
        run_ranks(hang_in_collective, 3, str(tmp_path), 1, backend="gloo", collective_timeout_s=20)
    assert time.monotonic() - started < 40
    pids = recorded_pids(tmp_path)
    assert len(pids) == 3
    assert not any(alive(pid) for pid in pids)


@pytest.mark.slow
def test_ranks_die_with_a_killed_launcher(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        from tests.sharded_helpers import sleep_forever
        from tuner.distributed.ranks import run_ranks
        if __name__ == "__main__":
            run_ranks(sleep_forever, 2, {str(tmp_path)!r}, backend="gloo")
        """
    )
    (tmp_path / "launch.py").write_text(script)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    launcher = subprocess.Popen([sys.executable, str(tmp_path / "launch.py")], env=env)
    try:
        deadline = time.monotonic() + 60
        while len(recorded_pids(tmp_path)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        pids = recorded_pids(tmp_path)
        assert len(pids) == 2 and all(alive(p) for p in pids)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
