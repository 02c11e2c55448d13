"""A live worker's tuning child against a live service: it cannot read the service's data
folder or another job's folder (bubblewrap), never gets the worker's token, and nothing it
prints carries the token to the service. Without bubblewrap the worker refuses to start unless
the operator chose `none`, and an unsandboxed worker shows as such."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.core.config import Settings
from tests.service.fakes import HARDWARE
from tests.service.helpers import REPO, fxtune_env, thread_server, tiny_program
from tuner.host.child_env import Redactor
from tuner.host.sandbox import MEMORY_FOLDER_BYTES, SandboxUnavailable, bwrap_works
from worker.client import ServiceClient
from worker.config import WorkerSettings
from worker.loop import Worker

TOKEN = "worker-token-0123456789abcdef"
USER = "user-token-0123456789abcdef"


@pytest.fixture
def site() -> Iterator[Path]:
    """A folder outside /tmp (the sandbox's private /tmp would hide anything there anyway), as
    the default data folder under the home folder is."""
    root = Path(tempfile.mkdtemp(prefix="fxtune-sandboxed-jobs-", dir=Path.home()))
    try:
        yield root
    finally:
        shutil.rmtree(root)


@pytest.fixture
def live(site: Path) -> Iterator[tuple[str, Settings]]:
    # A lease a loaded machine's claim, download and child start fit in: with 3 s the reaper
    # could requeue the job before its first heartbeat, which then found the lease gone and
    # relayed no progress (once in some twenty runs of the suite on 2 cores).
    settings = Settings(data_dir=site / "data", api_token=USER, worker_token=TOKEN, lease_s=10)
    with thread_server(settings) as (url, _app):
        yield url, settings


def queue_job(url: str, site: Path) -> int:
    program = site / "programs" / "tiny.pt2"
    tiny_program(program)
    with program.open("rb") as f:
        resp = httpx.post(
            f"{url}/api/v1/models",
            files={"file": f},
            data={"tune": "true"},
            headers={"Authorization": f"Bearer {USER}"},
            timeout=60,  # the upload's check starts a child that imports torch
        )
    resp.raise_for_status()
    return resp.json()["job"]["id"]


def snooping_worker(url: str, site: Path, sandbox: str, monkeypatch: pytest.MonkeyPatch) -> Worker:
    data = site / "data"
    blob = next(p for p in (data / "artifacts" / "blobs").rglob("*") if p.is_file())
    other_job = site / "scratch" / "fxtune-job99-other"
    other_job.mkdir(parents=True, exist_ok=True)
    (other_job / "input.pt2").write_bytes(b"another user's model")
    targets = {"db": data / "fxtune.db", "blob": blob, "data": data, "other_job": other_job}
    monkeypatch.setenv("SNOOP_TARGETS", json.dumps({k: str(v) for k, v in targets.items()}))
    cache = site / "cache" / "decisions.json"
    cache.parent.mkdir(exist_ok=True)
    cache.write_text("{}")
    monkeypatch.setenv("SNOOP_WRITES", json.dumps({"shared_cache": str(cache)}))
    monkeypatch.setenv("SNOOP_FILL", "1")
    monkeypatch.setenv("LEAK_VALUE", TOKEN)  # as if the child had learned the token anyway
    monkeypatch.setenv("FXTUNE_WORKER_TOKEN", TOKEN)  # the worker's own environment has it
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    settings = WorkerSettings(
        server=url,
        worker_token=TOKEN,
        worker_sandbox=sandbox,  # type: ignore[arg-type]
        worker_tune_command=[sys.executable, "-m", "tests.worker.snoop_tune"],
        worker_scratch_dir=site / "scratch",
        worker_decision_cache=site / "cache" / "decisions.json",
        worker_child_env=["SNOOP_TARGETS", "SNOOP_WRITES", "SNOOP_FILL", "LEAK_VALUE"],
        worker_poll_s=0.1,
    )
    return Worker(settings, "cpu", HARDWARE, ServiceClient(url, TOKEN))


def job(url: str, job_id: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {USER}"}
    return httpx.get(f"{url}/api/v1/jobs/{job_id}", headers=headers).json()


def relayed(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The progress messages the worker sends the service (recorded on their way out)."""
    sent: list[str] = []
    beat = worker.client.heartbeat

    def recording(assignment: Any, progress: float, message: str) -> None:
        sent.append(message)
        beat(assignment, progress, message)

    monkeypatch.setattr(worker.client, "heartbeat", recording)
    return sent


def findings(sent: list[str]) -> dict[str, Any]:
    return json.loads(next(m for m in sent if m.startswith("{")))


@pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run on this machine")
def test_a_sandboxed_child_sees_none_of_the_service_and_leaks_no_token(
    live: tuple[str, Settings], site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = live
    job_id = queue_job(url, site)
    worker = snooping_worker(url, site, "auto", monkeypatch)
    assert worker.sandbox_kind == "bwrap" and worker.hardware["sandbox"] == "bwrap"
    sent = relayed(worker, monkeypatch)
    assert worker.run(once=True) == 1
    found = findings(sent)
    assert found["seen"] == {
        "db": "FileNotFoundError",
        "blob": "FileNotFoundError",
        "data": "FileNotFoundError",
        "other_job": "FileNotFoundError",
        "write_shared_cache": "FileNotFoundError",  # the caches it reads: a read-only snapshot
        "fill_tmp": MEMORY_FOLDER_BYTES,  # 1 GiB tried: the memory-backed folders are capped
        "fill_shm": MEMORY_FOLDER_BYTES,
        # Its own namespace's processes only (bubblewrap's init), none holding a token.
        "environ": {"readable": 1, "with_token": 0},
        "env_token": False,
    }
    assert json.loads((site / "cache" / "decisions.json").read_text()) == {}
    assert found["leak"] == "[redacted]"
    done = job(url, job_id)
    assert done["status"] == "failed" and done["worker_sandbox"] == "bwrap"
    assert done["error"] == "error: leaking [redacted] from http://w:[redacted]@h/"
    assert TOKEN not in json.dumps(done) and TOKEN not in json.dumps(sent)


def test_the_same_child_unsandboxed_reads_everything(
    live: tuple[str, Settings], site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with `none`, what the sandbox hides is there to read, and without the
    worker's masking the token would reach the service."""
    url, _ = live
    job_id = queue_job(url, site)
    worker = snooping_worker(url, site, "none", monkeypatch)
    worker.redact = Redactor()
    sent = relayed(worker, monkeypatch)
    assert worker.run(once=True) == 1
    seen = findings(sent)["seen"]
    assert seen["db"].startswith("read") and seen["blob"].startswith("read")
    assert seen["write_shared_cache"] == "wrote"
    assert seen["fill_tmp"] == 1024**3 or seen["fill_tmp"] > MEMORY_FOLDER_BYTES
    assert seen["environ"]["readable"] > 0
    assert seen["other_job"] == "listed input.pt2"
    assert seen["env_token"] is False  # the allowlist holds without a sandbox too
    done = job(url, job_id)
    assert TOKEN in done["error"] and done["worker_sandbox"] == "none"


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr("tuner.host.sandbox.shutil.which", lambda _name: None)
    bwrap_works.cache_clear()
    yield
    bwrap_works.cache_clear()


@pytest.mark.parametrize("mode", ["auto", "bwrap"])
def test_without_bubblewrap_a_worker_refuses_unless_none_was_chosen(
    no_bwrap: None, mode: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache" / "decisions.json"
    settings = WorkerSettings(worker_sandbox=mode, worker_decision_cache=cache)  # type: ignore[arg-type]
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        Worker(settings, "cpu", HARDWARE, ServiceClient("http://127.0.0.1:9", None))
    chosen = WorkerSettings(worker_sandbox="none", worker_decision_cache=cache)
    worker = Worker(chosen, "cpu", HARDWARE, ServiceClient("http://127.0.0.1:9", None))
    assert worker.hardware["sandbox"] == "none"


def test_fxtune_worker_exits_2_without_bubblewrap_and_says_what_to_do(tmp_path: Path) -> None:
    """The real command, on a PATH without bwrap: refused before it claims anything."""
    path = tmp_path / "bin"
    path.mkdir()
    env = fxtune_env(PATH=str(path), FXTUNE_WORKER_DECISION_CACHE=str(tmp_path / "d.json"))
    cmd = [sys.executable, "-m", "fxtune_cli", "worker", "--device", "cpu", "--once"]
    cmd += ["--server", "http://127.0.0.1:9"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert (
        "install Debian's `bubblewrap`" in proc.stderr
        and "FXTUNE_WORKER_SANDBOX=none" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert os.environ.get("PATH") != str(path)
