"""Worker identity and result validation: only workers report, and only results that fit the job.

A user with the API token once claimed a job and completed it with another model's program and
report: the artifact route served the wrong bytes, the other model's fingerprint was overwritten
and a `cpu` report was stored for an `xla` job. Each of those is refused here, on SQLite and
PostgreSQL, and the right model's bytes are still what the artifact route serves.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from service.core.config import Settings
from service.main import create_app
from tests.service.fakes import config, program_fingerprint, upload_parts, write_result
from tests.service.helpers import LOCAL
from tests.service.in_process_checks import in_process_checks

USER = "user-s3cret"
WORKER = "worker-s3cret"
ELSEWHERE = ("203.0.113.9", 40000)


class Wide(torch.nn.Module):
    """Another structure than TinyNet, so another fingerprint."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from tests.service.helpers import tiny_program

    root = tmp_path_factory.mktemp("programs")
    tiny_program(root / "a.pt2")
    x = (torch.randn(2, 8),)
    torch.export.save(torch.export.export(Wide().eval(), x), root / "b.pt2")
    return {"a": root / "a.pt2", "b": root / "b.pt2"}


@pytest.fixture
def app_settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data", database_url=db_url, api_token=USER, worker_token=WORKER
    )


@pytest.fixture
def clients(app_settings: Settings) -> Iterator[dict[str, TestClient]]:
    app = create_app(app_settings, checks=in_process_checks)
    with TestClient(app, base_url=LOCAL, client=ELSEWHERE) as base:
        user = TestClient(app, base_url=LOCAL, client=ELSEWHERE)
        user.headers["Authorization"] = f"Bearer {USER}"
        worker = TestClient(app, base_url=LOCAL, client=ELSEWHERE)
        worker.headers["Authorization"] = f"Bearer {WORKER}"
        yield {"anon": base, "user": user, "worker": worker}


def upload(client: TestClient, path: Path, **fields: str) -> dict[str, Any]:
    with path.open("rb") as f:
        resp = client.post("/api/v1/models", files={"file": (path.name, f)}, data=fields)
    assert resp.status_code == 201, resp.text
    return resp.json()


def complete(client: TestClient, claim: dict[str, Any], files: dict[str, Path]) -> Any:
    return client.post(
        f"/api/v1/jobs/{claim['job']['id']}/complete",
        data={"lease_token": claim["lease_token"]},
        files=upload_parts(files),
    )


def test_worker_routes_refuse_the_user_token(
    clients: dict[str, TestClient], programs: dict[str, Path], tmp_path: Path
) -> None:
    user, worker = clients["user"], clients["worker"]
    model = upload(user, programs["a"], tune="true")
    body = {"worker_id": "w", "device": "cpu"}
    refused = user.post("/api/v1/jobs/claim", json=body)
    assert refused.status_code == 403 and "FXTUNE_WORKER_TOKEN" in refused.json()["detail"]
    assert clients["anon"].post("/api/v1/jobs/claim", json=body).status_code == 401
    claim = worker.post("/api/v1/jobs/claim", json=body).json()
    lease = {"lease_token": claim["lease_token"]}
    job = claim["job"]["id"]
    # The lease token alone authorises the job's reports: no bearer token opens them without it.
    wrong = {"lease_token": "not-the-lease"}
    for who in (user, worker, clients["anon"]):
        assert who.post(f"/api/v1/jobs/{job}/heartbeat", json=wrong).status_code == 409
        assert who.post(f"/api/v1/jobs/{job}/fail", json={**wrong, "error": "x"}).status_code == 409
        parts = write_result(tmp_path / "forged", programs["a"])
        forged = complete(who, {**claim, "lease_token": "not-the-lease"}, parts)
        assert forged.status_code == 409, forged.text
    assert user.get(f"/api/v1/jobs/{job}").json()["status"] == "running"
    assert clients["anon"].post(f"/api/v1/jobs/{job}/heartbeat", json=lease).status_code == 200
    # The worker token is not a user token either.
    enqueue = worker.post(f"/api/v1/models/{model['id']}/jobs", json={"device": "cuda"})
    assert enqueue.status_code == 403
    assert worker.get("/api/v1/models").status_code == 403
    # The owner reads the upload back; the job's program opens with its lease, to anyone
    # holding it, and the worker token opens neither the upload nor another model's.
    upload_url = f"/api/v1/models/{model['id']}/file"
    assert user.get(upload_url).content == programs["a"].read_bytes()
    assert worker.get(upload_url).status_code == 403
    by_lease = clients["anon"].get(
        claim["artifact_url"], headers={"X-Fxtune-Lease": lease["lease_token"]}
    )
    assert by_lease.content == programs["a"].read_bytes()
    assert worker.get(claim["artifact_url"]).status_code == 401
    done = complete(worker, claim, write_result(tmp_path / "ok", programs["a"]))
    assert done.status_code == 200, done.text


def test_results_for_another_model_or_device_are_refused(
    clients: dict[str, TestClient], programs: dict[str, Path], tmp_path: Path
) -> None:
    user, worker = clients["user"], clients["worker"]
    a = upload(user, programs["a"], tune="true")
    b = upload(user, programs["b"])
    fp_a, fp_b = program_fingerprint(programs["a"]), program_fingerprint(programs["b"])
    assert a["fingerprint"] == fp_a and b["fingerprint"] == fp_b and fp_a != fp_b
    claim = worker.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"}).json()

    # Model b's program and report, handed in for model a's job.
    other = complete(worker, claim, write_result(tmp_path / "b", programs["b"]))
    assert other.status_code == 422 and "another model" in other.json()["detail"]
    # A report naming a's fingerprint but measured on another device kind.
    refused = complete(
        worker, claim, write_result(tmp_path / "dev", programs["a"], config(fp_a, device="cuda"))
    )
    assert refused.status_code == 422 and "measured on 'cuda'" in refused.json()["detail"]
    # A program that does not load is refused even with a fitting report.
    broken = write_result(tmp_path / "broken", programs["a"])
    broken["program"].write_bytes(b"PK\x05\x06" + b"\0" * 18)
    assert complete(worker, claim, broken).status_code == 422

    assert user.get(f"/api/v1/models/{a['id']}/config").status_code == 404
    assert user.get(f"/api/v1/models/{b['id']}").json()["fingerprint"] == fp_b
    assert user.get(f"/api/v1/jobs/{claim['job']['id']}").json()["status"] == "running"
    ok = complete(worker, claim, write_result(tmp_path / "a", programs["a"]))
    assert ok.status_code == 200, ok.text
    art = user.get(f"/api/v1/models/{a['id']}/artifact", params={"device": "cpu"})
    assert art.content == programs["a"].read_bytes() != programs["b"].read_bytes()
    assert user.get(f"/api/v1/models/{b['id']}").json()["fingerprint"] == fp_b


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("device", ["xla", "cuda"])
def test_a_cpu_report_for_an_accelerator_job_is_refused(
    clients: dict[str, TestClient], programs: dict[str, Path], tmp_path: Path, device: str
) -> None:
    user, worker = clients["user"], clients["worker"]
    model = upload(user, programs["a"])
    user.post(f"/api/v1/models/{model['id']}/jobs", json={"device": device})
    claim = worker.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": device}).json()
    files = write_result(tmp_path / "cpu", programs["a"])  # hardware.device == "cpu"
    refused = complete(worker, claim, files)
    assert refused.status_code == 422
    assert f"job {claim['job']['id']} is for '{device}'" in refused.json()["detail"]
    fp = program_fingerprint(programs["a"])
    right = write_result(tmp_path / "acc", programs["a"], config(fp, device=device))
    assert complete(worker, claim, right).status_code == 200
    cpu = user.get(f"/api/v1/models/{model['id']}/config", params={"device": "cpu"})
    assert cpu.status_code == 404  # nothing was stored under cpu


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_upload_the_safe_loader_refuses_is_a_422(
    clients: dict[str, TestClient], programs: dict[str, Path], tmp_path: Path
) -> None:
    from tests.service.helpers import malicious_program

    marker = tmp_path / "PWNED"
    evil = malicious_program(programs["a"], tmp_path / "evil.pt2", marker)
    with evil.open("rb") as f:
        resp = clients["user"].post("/api/v1/models", files={"file": ("evil.pt2", f)})
    assert resp.status_code == 422
    assert "cannot be loaded safely" in resp.json()["detail"]
    assert not marker.exists()
    assert clients["user"].get("/api/v1/models").json() == []


def test_no_tokens_keeps_loopback_workers_working(
    db_url: str, tmp_path: Path, programs: dict[str, Path]
) -> None:
    settings = Settings(data_dir=tmp_path / "d", database_url=db_url)
    app = create_app(settings, checks=in_process_checks)
    body = {"worker_id": "w", "device": "cpu"}
    with TestClient(app, base_url=LOCAL, client=("127.0.0.1", 5)) as local:
        upload(local, programs["a"], tune="true")
        remote = TestClient(app, base_url=LOCAL, client=ELSEWHERE)
        assert remote.post("/api/v1/jobs/claim", json=body).status_code == 403
        claim = local.post("/api/v1/jobs/claim", json=body)
        assert claim.status_code == 200
        done = complete(local, claim.json(), write_result(tmp_path / "ok", programs["a"]))
        assert done.status_code == 200, done.text
