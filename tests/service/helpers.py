"""Shared by the service, worker and end-to-end tests: tiny programs, crafted archives, and
live servers and workers (in a thread or in a subprocess)."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import torch
import uvicorn

from service.analysis import ProgramAnalysis, program_analysis
from service.core.config import Settings
from service.launch import free_port
from service.main import create_app
from tests.run_settings import RUN_CACHE_ENV, RUN_TIMING

REPO = Path(__file__).resolve().parents[2]
# For the loops that poll a live service: `httpx.get` builds a client, and with it an SSL
# context (30 ms of CPU), on every call. No keep-alive: the services polled come and go.
POLL = httpx.Client(timeout=10, limits=httpx.Limits(max_keepalive_connections=0))


def healthy(url: str) -> bool:
    """Whether the service at `url` answers /healthz (not yet, or no longer: False)."""
    try:
        return POLL.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


# TestClient's default Host ("testserver") is not an address of the service: the Host check
# refuses it like any DNS-rebinding name, so in-process clients talk to loopback.
LOCAL = "http://127.0.0.1"
# For services whose tests are about the API, not about checking a worker's result: results are
# stored without the child that runs the tuned program against the upload (a Python that
# imports torch: about 5 s of CPU per completion). test_api.py, test_worker_auth.py,
# test_forged_results.py and the end-to-end tests keep the check (the first two run it in the
# test's process: tests/service/in_process_checks.py).
RESULTS_UNCHECKED: dict[str, Any] = {"result_check": "none"}


class TinyNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.drop = torch.nn.Dropout(0.2)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def tiny_program(path: Path, seed: int = 0) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    """Save a small exported program (sample inputs inside); returns the module and inputs."""
    torch.manual_seed(seed)
    module = TinyNet().eval()
    inputs = (torch.randn(2, 8),)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(torch.export.export(module, inputs), path)
    return module, inputs


def variant(src: Path, dst: Path, tag: str) -> Path:
    """The same archive with a different zip comment: other bytes, same program."""
    shutil.copy(src, dst)
    with zipfile.ZipFile(dst, "a") as zf:
        zf.comment = tag.encode()
    return dst


class _Payload:
    """Unpickling this creates `marker`: proof that the archive's pickle ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


def malicious_program(src: Path, dst: Path, marker: Path) -> Path:
    """`src` with its pickled sample inputs replaced by a payload that writes `marker`."""
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)
    replaced = False
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("data/sample_inputs/model.pt"):
                data, replaced = buf.getvalue(), True
            zout.writestr(item, data)
    assert replaced, "the archive layout changed: no sample inputs member to replace"
    return dst


def payload_runs_under_plain_load(path: Path, marker: Path) -> bool:
    """Check in a child process that plain `torch.export.load` really runs the payload."""
    code = "import sys, torch; torch.export.load(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, check=False)
    ran = marker.exists()
    marker.unlink(missing_ok=True)
    return ran


def blob_count(data_dir: Path) -> int:
    return sum(1 for p in (data_dir / "artifacts" / "blobs").rglob("*") if p.is_file())


def spool_count(data_dir: Path) -> int:
    return sum(1 for _ in (data_dir / "artifacts" / "tmp").iterdir())


def wait_for(predicate: Any, timeout_s: float, what: str, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@contextlib.contextmanager
def thread_server(
    settings: Settings, checks: Callable[[Settings], ProgramAnalysis] = program_analysis
) -> Iterator[tuple[str, Any]]:
    """uvicorn in a thread of the test process: a real HTTP server without a slow start-up.
    `checks`: how the service checks uploads and results (`create_app`'s; default: the
    sandboxed children)."""
    app = create_app(settings, checks=checks)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, 30, "the in-thread server to start", 0.05)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextlib.contextmanager
def sqlite_service(root: Path, **settings: Any) -> Iterator[str]:
    """A live service whose data and SQLite database live in `root`: for module fixtures."""
    db = f"sqlite:///{root / 'db.sqlite'}"
    with thread_server(Settings(data_dir=root / "data", database_url=db, **settings)) as live:
        yield live[0]


def fxtune_env(**env: str) -> dict[str, str]:
    """This process's environment without its FXTUNE_ settings, plus `env`. A worker warms no
    compile caches unless `env` asks (tests/worker/test_warm_temp.py does): a real AOTInductor
    build in every worker a test starts would cost the suite minutes of CPU. The run's own
    settings stay (tests/run_settings.py), and a worker passes the stopping rule on to its
    tuning children."""
    kept = {*RUN_CACHE_ENV, *RUN_TIMING}
    base = {k: v for k, v in os.environ.items() if not k.startswith("FXTUNE_") or k in kept}
    return {
        **base,
        "PYTHONPATH": str(REPO),
        "FXTUNE_WORKER_WARM_COMMAND": "[]",
        "FXTUNE_WORKER_CHILD_ENV": ",".join(RUN_TIMING),
        **env,
    }


@contextlib.contextmanager
def worker_process(url: str, env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """`fxtune worker` in a subprocess; killed at the end if still running."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fxtune_cli", "worker", "--server", url, "--device", "cpu"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def children(pid: int) -> list[int]:
    """Direct children of a process (Linux /proc); none once it has ended, even mid-scan."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:  # ended (or reaped) between the caller's look and ours
        return []
    found: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError):
            found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return found


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False
