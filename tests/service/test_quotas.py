"""Quotas per token and the bound on concurrent checks, through the API (issue 47).

A flood of uploads from one token meets its uploads-per-minute quota (429 with Retry-After,
before the body is read), its jobs quota and its storage quota; a burst of uploads past the
check slots and their queue gets 503 with Retry-After. Every refusal stores nothing: no blob, no
spool, no row. The checks run in this process (tests/service/in_process_checks.py), or, for the
burst, in a fake checker that holds its slot until the test lets it go.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.analysis import ProgramAnalysis, analysis_limits
from service.check_gate import CheckGate, check_capacity
from service.core.config import Settings
from service.main import create_app
from service.quotas import UploadWindow
from service.store import OverQuota
from tests.service.dashboard_pages import page
from tests.service.helpers import (
    LOCAL,
    blob_count,
    spool_count,
    thread_server,
    tiny_program,
    variant,
    wait_for,
)
from tests.service.in_process_checks import in_process_checks

TOKEN = "quota-s3cret"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
LOOPBACK = ("127.0.0.1", 40000)


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Six uploads of distinct bytes (one program, other zip comments)."""
    root = tmp_path_factory.mktemp("quota-programs")
    tiny_program(root / "tiny.pt2")
    return [variant(root / "tiny.pt2", root / f"v{i}.pt2", f"v{i}") for i in range(6)]


def settings_for(tmp_path: Path, **quota: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        api_token=TOKEN,
        max_upload_mb=0.5,
        **quota,
    )


@pytest.fixture
def client_for(tmp_path: Path) -> Iterator[Any]:
    clients: list[TestClient] = []

    def make(**quota: Any) -> TestClient:
        app = create_app(settings_for(tmp_path, **quota), checks=in_process_checks)
        c = TestClient(app, base_url=LOCAL, client=LOOPBACK, headers=BEARER)
        clients.append(c.__enter__())
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)


def upload(client: Any, path: Path, **fields: str) -> Any:
    with path.open("rb") as f:
        return client.post("/api/v1/models", files={"file": (path.name, f)}, data=fields)


def test_the_upload_window_slides_and_names_the_wait() -> None:
    now = [1000.0]
    window = UploadWindow(3, clock=lambda: now[0])
    for step in (0, 10, 20):
        now[0] = 1000.0 + step
        window.admit("alice")
    window.admit("bob")  # each identity has its own
    with pytest.raises(OverQuota) as over:
        window.admit("alice")
    assert over.value.kind == "uploads_per_minute" and over.value.retry_after_s == 40
    now[0] = 1060.5  # the first one left the window
    window.admit("alice")
    assert window.count("alice") == 3 and UploadWindow(None).count("alice") == 0


def test_a_flood_of_uploads_meets_the_per_minute_quota_before_its_body_is_read(
    client_for: Any, programs: list[Path], tmp_path: Path
) -> None:
    client = client_for(quota_uploads_per_minute=3)
    assert [upload(client, p).status_code for p in programs[:3]] == [201, 201, 201]
    refused = [upload(client, p) for p in programs[3:]]
    for resp in refused:
        assert resp.status_code == 429, resp.text
        assert 1 <= int(resp.headers["retry-after"]) <= 60
        assert "FXTUNE_QUOTA_UPLOADS_PER_MINUTE=3" in resp.json()["detail"]
    # Over quota, even a body past the upload cap is not read (else it would be a 413).
    big = client.post("/api/v1/models", files={"file": ("big.pt2", b"0" * (1 << 20))})
    assert big.status_code == 429
    data = tmp_path / "data"
    assert blob_count(data) == 3 and spool_count(data) == 0
    assert len(client.get("/api/v1/models").json()) == 3
    quota = client.get("/api/v1/quota").json()
    assert quota["uploads_per_minute"] == {"used": 3, "limit": 3}
    assert quota["identity"].startswith("token-") and TOKEN not in quota["identity"]


def test_the_jobs_quota_refuses_new_jobs_and_their_uploads_store_nothing(
    client_for: Any, programs: list[Path], tmp_path: Path
) -> None:
    client = client_for(quota_active_jobs=2)
    first = upload(client, programs[0], tune="true").json()
    upload(client, programs[1], tune="true")
    again = upload(client, programs[0], tune="true")  # its job is reused: no new job
    assert again.status_code == 200 and again.json()["job"]["id"] == first["job"]["id"]
    third = upload(client, programs[2], tune="true")
    assert third.status_code == 429 and third.headers["retry-after"] == "30"
    assert "FXTUNE_QUOTA_ACTIVE_JOBS=2" in third.json()["detail"]
    assert blob_count(tmp_path / "data") == 2  # refused before its check: nothing stored
    more = client.post(f"/api/v1/models/{first['id']}/jobs", json={"device": "xla"})
    assert more.status_code == 429
    assert upload(client, programs[2]).status_code == 201  # without tune=true: fine
    quota = client.get("/api/v1/quota").json()
    assert quota["active_jobs"] == {"used": 2, "limit": 2}
    rows = {r.attrs["data-quota"]: r.attrs for r in page(client, "/").tables["quota-table"]}
    assert (rows["active_jobs"]["data-used"], rows["active_jobs"]["data-limit"]) == ("2", "2")
    assert rows["checks"]["data-limit"] == str(quota["checks"]["slots"])


def test_the_storage_quota_counts_new_bytes_only(
    client_for: Any, programs: list[Path], tmp_path: Path
) -> None:
    size = programs[0].stat().st_size
    client = client_for(quota_stored_mb=1.5 * size / 2**20)
    assert upload(client, programs[0]).status_code == 201
    refused = upload(client, programs[1])
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) > 0
    assert "FXTUNE_QUOTA_STORED_MB" in refused.json()["detail"]
    assert upload(client, programs[0]).status_code == 200  # the same bytes: nothing new
    assert blob_count(tmp_path / "data") == 1 and spool_count(tmp_path / "data") == 0
    assert client.get("/api/v1/quota").json()["stored_bytes"]["used"] == size


class HeldChecks(ProgramAnalysis):
    """A checker whose every check holds its slot until `release` is set, then answers."""

    release = threading.Event()

    def _run_now(self, args: list[str], files: dict[str, Path], what: str) -> dict[str, Any]:
        assert self.release.wait(60)
        return {"fingerprint": "f" * 32}


def held_checks(settings: Settings) -> ProgramAnalysis:
    gate = CheckGate(check_capacity(settings))
    return HeldChecks(settings.data_dir / "analysis", analysis_limits(settings), gate=gate)


def test_uploads_past_the_check_slots_and_queue_get_503_and_lose_nothing(
    programs: list[Path], tmp_path: Path
) -> None:
    settings = settings_for(tmp_path, analysis_concurrency=1, analysis_queue=1)
    HeldChecks.release.clear()
    with thread_server(settings, checks=held_checks) as (url, app):
        http = httpx.Client(base_url=url, headers=BEARER, timeout=60)

        def send(path: Path) -> httpx.Response:
            with path.open("rb") as f:
                return http.post("/api/v1/models", files={"file": (path.name, f)})

        gate = app.state.analysis.gate
        with ThreadPoolExecutor(4) as pool:
            running = pool.submit(send, programs[0])
            wait_for(lambda: gate.state().running == 1, 30, "the first check to start")
            queued = pool.submit(send, programs[1])
            wait_for(lambda: gate.state().waiting_uploads == 1, 30, "the second to queue")
            busy = [send(p) for p in programs[2:4]]
            checks = http.get("/api/v1/quota").json()["checks"]
            HeldChecks.release.set()
            statuses = [running.result().status_code, queued.result().status_code]
        for resp in busy:
            assert resp.status_code == 503, resp.text
            assert int(resp.headers["retry-after"]) >= 1
            assert "nothing was stored" in resp.json()["detail"]
        assert statuses == [201, 201]
        assert checks == {"running": 1, "waiting": 1, "slots": 1, "queue": 1}
        assert send(programs[2]).status_code == 201  # slots free again: a normal upload passes
        assert len(http.get("/api/v1/models").json()) == 3
        # Turned away by the service, the two do not count against the token's quota.
        assert http.get("/api/v1/quota").json()["uploads_per_minute"]["used"] == 3
        http.close()
    assert blob_count(tmp_path / "data") == 3 and spool_count(tmp_path / "data") == 0
