"""SIGTERM ends `fxtune serve --embedded-worker` and `python -m examples.demo --keep-serving`
together with every process they started (the service, its worker, a running tuning child):
nothing is left behind as an orphan. Warm checkers have a test of their own, after SIGTERM and
SIGKILL (`test_no_warm_checker_outlives_fxtune_serve`); the other services here start none
(`FXTUNE_WARM_CHECKERS=0`): each would be a sandboxed child importing torch, about 2.7 s of CPU,
and a check takes one and starts its replacement."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service.launch import free_port
from tests.service.helpers import (
    REPO,
    children,
    fxtune_env,
    healthy,
    pid_alive,
    tiny_program,
    wait_for,
)
from tuner.host.sandbox import bwrap_works

SANDBOX = "auto" if bwrap_works() else "none"


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def terminate_and_check(proc: subprocess.Popen[bytes], tree: set[int]) -> None:
    """SIGTERM the top process; it and every process of `tree` must be gone within 60 s."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the process did not exit within 60 s of SIGTERM") from None
    left = lambda: [p for p in tree if pid_alive(p)]  # noqa: E731
    try:
        wait_for(lambda: not left(), 30, "every child to end")
    finally:
        for pid in left():
            print("orphan:", pid, cmdline(pid))
            os.kill(pid, signal.SIGKILL)


def tuning_tree(pid: int) -> set[int]:
    """Once a tuning child runs: the service's whole tree (worker, sandbox, tuner)."""
    tree = descendants(pid)
    return tree if any("fake_tune" in cmdline(p) for p in tree) else set()


def test_sigterm_ends_fxtune_serve_and_its_worker_and_tuning_child(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_WORKER_SANDBOX=SANDBOX,
        FXTUNE_WORKER_TUNE_COMMAND=f'["{sys.executable}", "-m", "tests.worker.fake_tune"]',
        FXTUNE_WORKER_CHILD_ENV="FAKE_TUNE",
        FXTUNE_WORKER_DECISION_CACHE=str(tmp_path / "cache" / "decisions.json"),
        FXTUNE_WORKER_POLL_S="0.2",
        FXTUNE_WORKER_SCRATCH_DIR=str(tmp_path / "scratch"),
        FXTUNE_WARM_CHECKERS="0",
        FAKE_TUNE="sleep",
    )
    cmd = [sys.executable, "-m", "fxtune_cli", "serve", "--port", str(port), "--embedded-worker"]
    with (tmp_path / "serve.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: healthy(url), 120, "the service")
        program = tmp_path / "tiny.pt2"
        tiny_program(program)
        with program.open("rb") as f:
            httpx.post(f"{url}/api/v1/models", files={"file": f}, data={"tune": "true"}, timeout=60)
        tree = wait_for(lambda: tuning_tree(proc.pid), 120, "a tuning child to run")
        assert len(tree) >= 3, [cmdline(p) for p in tree]  # worker, (sandbox,) tuner
        terminate_and_check(proc, tree)
    finally:
        if proc.poll() is None:
            proc.kill()
    log_text = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in log_text, log_text[-3000:]
    # Stopped, not killed: the worker cancelled the job and removed its folder on the way out.
    assert "received SIGTERM; stopping after cleaning up" in log_text
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_worker_that_cannot_start_stops_the_service_with_its_code(tmp_path: Path) -> None:
    """On the H200 the embedded worker refused to start (no bubblewrap) and `fxtune serve` went
    on serving: the upload's job stayed queued until the client gave up. A worker without its
    device (XLA here, where torch_xla is not installed) must stop the service, with its code."""
    port = free_port()
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_WORKER_SANDBOX=SANDBOX,
        FXTUNE_WARM_CHECKERS="0",
    )
    cmd = [sys.executable, "-m", "fxtune_cli", "serve", "--port", str(port),
           "--embedded-worker", "--worker-device", "xla"]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 4, done.stderr[-3000:]  # the worker's: the device is unavailable
    assert "the embedded worker exited with code 4; the service stops" in done.stderr
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_sigterm_ends_the_demo_and_the_service_it_keeps_serving(tmp_path: Path) -> None:
    env = fxtune_env(
        FXTUNE_WORKER_SANDBOX=SANDBOX,
        FXTUNE_WORKER_DECISION_CACHE=str(tmp_path / "cache" / "decisions.json"),
        FXTUNE_WARM_CHECKERS="0",  # the demo's service inherits it
        TMPDIR=str(tmp_path),
    )
    cmd = [sys.executable, "-m", "examples.demo", "--keep-serving", "--budget-s", "5"]
    with (tmp_path / "demo.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        # The service runs and its worker tunes the first example.
        tree = wait_for(lambda: _demo_tree(proc.pid), 180, "the demo's service and a tuning job")
        terminate_and_check(proc, tree)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not list(tmp_path.glob("fxtune-demo-*")), "the demo's temporary folder was left"


WARM_CHECKER = "tuner.checks.inspect warm"


def warm_checkers(pid: int) -> set[int]:
    return {p for p in descendants(pid) if WARM_CHECKER in cmdline(p)}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_no_warm_checker_outlives_fxtune_serve(tmp_path: Path, sig: signal.Signals) -> None:
    """After an upload (its checker exited, a replacement started), the signal leaves nothing:
    SIGTERM through the app's shutdown, SIGKILL through the children's death signal."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = fxtune_env(FXTUNE_DATA_DIR=str(tmp_path / "data"))
    cmd = [sys.executable, "-m", "fxtune_cli", "serve", "--port", str(port)]
    with (tmp_path / "serve.log").open("w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: healthy(url), 120, "the service")
        first = wait_for(lambda: warm_checkers(proc.pid), 60, "a warm checker to start")
        program = tmp_path / "tiny.pt2"
        tiny_program(program)
        with program.open("rb") as f:
            resp = httpx.post(f"{url}/api/v1/models", files={"file": f}, timeout=300)
        assert resp.status_code == 201, resp.text
        assert not any(pid_alive(p) for p in first)  # it checked the upload and exited
        replacement = wait_for(lambda: warm_checkers(proc.pid) - first, 60, "a replacement")
        tree = descendants(proc.pid)
        assert replacement <= tree
        if sig == signal.SIGTERM:
            terminate_and_check(proc, tree)
            assert not list((tmp_path / "data" / "analysis").iterdir())
        else:
            proc.kill()
            proc.wait(30)
            try:
                wait_for(lambda: not [p for p in tree if pid_alive(p)], 30, "every child to end")
            finally:
                for pid in [p for p in tree if pid_alive(p)]:
                    os.kill(pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def _demo_tree(pid: int) -> set[int]:
    tree = descendants(pid)
    lines = [cmdline(p) for p in tree]
    serving = any(" serve " in line for line in lines)
    tuning = any(" tune " in line for line in lines)
    return tree if serving and tuning else set()
