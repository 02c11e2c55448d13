"""Hostile models reaching a live worker anyway (planted past the upload check): the real tuner
child refuses each one at once, runs none of it, and leaves nothing behind."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.core.config import Settings
from tests.crafted import CODE_MARKER, MARKER_ENV
from tests.service.fakes import HARDWARE
from tests.service.helpers import REPO, thread_server
from worker.client import ServiceClient
from worker.config import WorkerSettings
from worker.loop import Worker

# One of each kind of refusal, each a tuning child of its own (5 s here): a hostile archive, a
# string torch's deserializer would evaluate, a resource bomb. Every crafted file is refused by
# the loader (tests/tuner/loading/test_load.py) and by `fxtune sites` with exit 3
# (tests/tuner/loading/test_untrusted_programs.py); this is the worker's path around it.
PLANTED = ("planted_library", "expression_exec", "zeros_bomb")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    settings = Settings(
        data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}"
    )
    with thread_server(settings) as live:
        yield live


def plant(app: Any, path: Path) -> int:
    """Store the file and queue a job for it, as if the upload check had let it through."""
    artifacts, store = app.state.artifacts, app.state.store
    spool = artifacts.spool(max_bytes=path.stat().st_size + 1, filename=path.name)
    spool.write(path.read_bytes())
    spool.close()
    artifacts.put(spool)
    model, _ = store.add_model(spool.sha256, path.name, path.stat().st_size, fingerprint="0" * 32)
    job, _ = store.enqueue_job(model.id, "cpu", 5.0)
    return job.id


@pytest.mark.slow
def test_a_live_worker_refuses_planted_models_and_leaves_nothing(
    server: tuple[str, Any],
    hostile: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, app = server
    marker, scratch = tmp_path / "marker", tmp_path / "scratch"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    settings = WorkerSettings(
        server=url,
        worker_poll_s=0.1,
        worker_scratch_dir=scratch,
        worker_decision_cache=tmp_path / "cache" / "decisions.json",
        worker_child_env=[MARKER_ENV],  # so a payload that ran would leave its marker
    )
    worker = Worker(settings, "cpu", HARDWARE, ServiceClient(url, None))
    jobs = {name: plant(app, hostile[name]) for name in PLANTED}
    assert worker.run(once=True) == 1
    while worker.run(once=True):
        pass
    for name, job_id in jobs.items():
        job = httpx.get(f"{url}/api/v1/jobs/{job_id}").json()
        assert job["status"] == "failed" and job["attempts"] == 1, (name, job)
        assert "refused" in job["error"], (name, job["error"])
    assert not marker.exists()
    assert not (hostile["good"].parent / CODE_MARKER).exists()
    assert list(scratch.iterdir()) == []  # job folders, temp files and caches all removed
