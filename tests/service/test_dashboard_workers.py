"""The dashboard's worker list: each worker of the recent jobs with the sandbox it declared at
its claim, so a worker whose operator chose FXTUNE_WORKER_SANDBOX=none stands out."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from service.core.config import Settings
from service.main import create_app
from tests.service.dashboard_pages import LOOPBACK, page
from tests.service.helpers import LOCAL, tiny_program, variant
from tests.service.in_process_checks import in_process_checks


def test_the_worker_list_shows_each_workers_sandbox(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db'}")
    program = tmp_path / "tiny.pt2"
    tiny_program(program)
    with TestClient(
        create_app(settings, checks=in_process_checks), base_url=LOCAL, client=LOOPBACK
    ) as client:
        for path in (program, variant(program, tmp_path / "b.pt2", "b")):
            with path.open("rb") as f:
                resp = client.post("/api/v1/models", files={"file": f}, data={"tune": "true"})
            assert resp.status_code == 201, resp.text
        claims = {}
        for worker, sandbox in (("open-worker", "none"), ("boxed-worker", "bwrap")):
            hardware = {"name": f"{worker} cpu", "sandbox": sandbox}
            body = {"worker_id": worker, "device": "cpu", "hardware": hardware}
            claims[worker] = client.post("/api/v1/jobs/claim", json=body).json()["job"]["id"]
        rows = {r.cells[0].text: r for r in page(client, "/").tables["workers-table"]}
        job = client.get(f"/api/v1/jobs/{claims['open-worker']}").json()
    assert set(rows) == {"open-worker", "boxed-worker"}
    unsandboxed = rows["open-worker"].cells[3]
    assert unsandboxed.text == "none: unsandboxed" and "error" in unsandboxed.classes
    assert rows["boxed-worker"].cells[3].text == "bubblewrap"
    assert rows["open-worker"].cells[2].text == "open-worker cpu"
    assert job["worker_sandbox"] == "none"
