"""Starting `fxtune serve` as a child process: for the demo, the screenshots and the e2e tests.

A real process on a real port (not an in-process app), so what runs is what a user runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import httpx

PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launching process dies (kill -9 included),
    so the service (and through it its worker) never outlives what started it."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Tries at a free port: between `free_port` closing its socket and the service binding the
# port, another process can take it (an e2e test's service exited with "address already in
# use" beside xdist's other workers).
PORT_TRIES = 3


class PortTaken(RuntimeError):
    """The service exited because another process had bound its port first."""


@contextlib.contextmanager
def serve_process(
    env: Mapping[str, str],
    log: Path,
    *args: str,
    start_timeout_s: float = 120,
) -> Iterator[str]:
    """`fxtune serve [args]` on a free loopback port; yields its base URL, stops it on exit.

    Stopping the service also stops an embedded worker (it dies with its parent). It runs in
    the log's folder, not in a checkout: the service must find everything as package data.
    A port taken before the service bound it is replaced by another (`PORT_TRIES`).
    """
    for tried in range(1, PORT_TRIES + 1):
        port = free_port()
        command = [sys.executable, "-m", "fxtune_cli", "serve", "--port", str(port)]
        if "--log-level" not in args:
            command += ["--log-level", "warning"]
        with log.open("w") as out:
            proc = subprocess.Popen(
                [*command, *args],
                cwd=log.parent,
                env=dict(env),
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_stop_with_parent,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_healthy(proc, url, log, start_timeout_s)
            break
        except PortTaken:
            if tried == PORT_TRIES:
                raise
        except BaseException:
            _stop(proc)
            raise
    try:
        yield url
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> None:
    """Poll /healthz through one client: `httpx.get` builds a client, and with it an SSL
    context (30 ms of CPU), on every call."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2) as client:
        while True:
            if proc.poll() is not None:
                said = log.read_text()[-3000:]
                taken = "address already in use" in said
                raise (PortTaken if taken else RuntimeError)(f"the service exited early:\n{said}")
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/healthz").status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the service did not answer /healthz; see {log}")
            time.sleep(0.25)
