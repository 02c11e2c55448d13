"""The HTTP API in-process (TestClient), on SQLite and PostgreSQL: contract, errors, auth."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from service.core.config import Settings
from service.main import create_app
from tests.service.fakes import (
    config,
    fake_aoti_package,
    program_fingerprint,
    training_config,
    upload_parts,
    write_result,
)
from tests.service.helpers import LOCAL, blob_count, spool_count, tiny_program, variant
from tests.service.in_process_checks import in_process_checks

LOOPBACK = ("127.0.0.1", 40000)
ELSEWHERE = ("203.0.113.9", 40000)
TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("programs") / "tiny.pt2"
    tiny_program(path)
    return path


@pytest.fixture(scope="module")
def fingerprint(program: Path) -> str:
    return program_fingerprint(program)


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=db_url, max_upload_mb=0.5)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(
        create_app(settings, checks=in_process_checks), base_url=LOCAL, client=LOOPBACK
    ) as c:
        yield c


def upload(client: TestClient, path: Path, **fields: str) -> Any:
    with path.open("rb") as f:
        return client.post("/api/v1/models", files={"file": (path.name, f)}, data=fields)


def claim(client: TestClient, device: str = "cpu") -> dict[str, Any]:
    resp = client.post("/api/v1/jobs/claim", json={"worker_id": "w1", "device": device})
    assert resp.status_code == 200, resp.text
    return resp.json()


def complete(client: TestClient, job: dict[str, Any], files: dict[str, Path]) -> Any:
    return client.post(
        f"/api/v1/jobs/{job['job']['id']}/complete",
        data={"lease_token": job["lease_token"]},
        files=upload_parts(files),
    )


def test_the_same_file_twice_is_one_model(client: TestClient, program: Path) -> None:
    first = upload(client, program, name="tiny")
    again = upload(client, program)
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert first.json()["name"] == "tiny" and first.json()["size_bytes"] == program.stat().st_size
    assert len(client.get("/api/v1/models").json()) == 1
    assert client.get(f"/api/v1/models/{first.json()['id']}/file").content == program.read_bytes()


def test_upload_with_tune_queues_one_job(client: TestClient, program: Path) -> None:
    first = upload(client, program, tune="true", device="cpu", budget_s="5").json()
    again = upload(client, program, tune="true").json()
    assert first["job"]["status"] == "queued" and first["job"]["budget_s"] == 5
    assert again["job"]["id"] == first["job"]["id"]
    listed = client.get("/api/v1/jobs").json()
    assert [j["id"] for j in listed] == [first["job"]["id"]]
    resp = client.post(f"/api/v1/models/{first['id']}/jobs", json={"device": "cuda"})
    assert resp.status_code == 202 and resp.json()["status"] == "queued"
    assert resp.json()["id"] != first["job"]["id"]


def test_a_job_may_name_the_sizes_to_tune_at(client: TestClient, program: Path) -> None:
    """Optional `sizes` (issue 9): stored with the job and handed to the worker that claims it."""
    model = upload(client, program).json()
    bad = client.post(
        f"/api/v1/models/{model['id']}/jobs", json={"device": "cpu", "sizes": {"batch": []}}
    )
    assert bad.status_code == 422
    resp = client.post(
        f"/api/v1/models/{model['id']}/jobs",
        json={"device": "cpu", "sizes": {"batch": [1, 32, 512]}},
    )
    assert resp.status_code == 202 and resp.json()["sizes"] == {"batch": [1, 32, 512]}
    claimed = client.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"})
    assert claimed.json()["job"]["sizes"] == {"batch": [1, 32, 512]}
    plain = upload(client, program, tune="true", device="cuda").json()
    assert plain["job"]["sizes"] is None


def test_a_distributed_job_needs_ranks_of_one_structure_and_a_worker_with_enough_ranks(
    client: TestClient, program: Path, tmp_path: Path
) -> None:
    """Issue 13: `world_size` with every rank's upload; claimed only by a worker of >= N ranks."""
    rank0 = upload(client, program).json()["id"]
    rank1 = upload(client, variant(program, tmp_path / "rank1.pt2", "rank 1")).json()["id"]
    other_path = tmp_path / "other.pt2"
    linear = torch.nn.Linear(8, 4).eval()
    torch.export.save(torch.export.export(linear, (torch.randn(2, 8),)), other_path)
    other = upload(client, other_path).json()["id"]
    jobs = f"/api/v1/models/{rank0}/jobs"
    refused = {
        "another structure": {"world_size": 2, "rank_models": [rank0, other]},
        "too few ranks named": {"world_size": 2, "rank_models": [rank0]},
        "ranks without world_size": {"rank_models": [rank0, rank1]},
        "sizes": {"world_size": 2, "rank_models": [rank0, rank1], "sizes": {"batch": [1]}},
    }
    for case, body in refused.items():
        resp = client.post(jobs, json={"device": "cpu", **body})
        assert resp.status_code == 422, (case, resp.text)
    assert (
        "one structure"
        in client.post(
            jobs, json={"device": "cpu", "world_size": 2, "rank_models": [rank0, other]}
        ).json()["detail"]
    )
    job = client.post(jobs, json={"device": "cpu", "world_size": 2, "rank_models": [rank0, rank1]})
    assert job.status_code == 202 and job.json()["world_size"] == 2
    one = client.post("/api/v1/jobs/claim", json={"worker_id": "w1", "device": "cpu"})
    assert one.status_code == 204
    two = client.post("/api/v1/jobs/claim", json={"worker_id": "w2", "device": "cpu", "ranks": 2})
    assert two.status_code == 200, two.text
    ranks = two.json()["ranks"]
    assert [(r["rank"], r["model"]["id"]) for r in ranks] == [(0, rank0), (1, rank1)]
    rank1 = client.get(
        ranks[1]["artifact_url"], headers={"X-Fxtune-Lease": two.json()["lease_token"]}
    )
    assert rank1.content == (tmp_path / "rank1.pt2").read_bytes()
    # A 1-rank result (no program for rank 1, no distributed report) is refused.
    files = write_result(tmp_path / "out", program)
    resp = complete(client, two.json(), files)
    assert resp.status_code == 422, resp.text
    assert client.get(f"/api/v1/jobs/{job.json()['id']}").json()["status"] == "running"


def test_a_worker_round_trip_serves_config_artifact_and_report(
    client: TestClient, program: Path, fingerprint: str, tmp_path: Path
) -> None:
    model = upload(client, program, tune="true").json()
    assert client.get(f"/api/v1/models/{model['id']}/config").status_code == 404
    gpu = client.post("/api/v1/jobs/claim", json={"worker_id": "g", "device": "cuda"})
    assert gpu.status_code == 204
    job = claim(client)
    assert job["model"]["sha256"] == model["sha256"]
    lease = {"X-Fxtune-Lease": job["lease_token"]}
    assert client.get(job["artifact_url"], headers=lease).content == program.read_bytes()
    assert client.get(job["artifact_url"]).status_code == 401  # the lease, not the worker, opens it
    wrong = client.get(job["artifact_url"], headers={"X-Fxtune-Lease": "forged"})
    assert wrong.status_code == 409
    beat = client.post(
        f"/api/v1/jobs/{job['job']['id']}/heartbeat",
        json={"lease_token": job["lease_token"], "progress": 0.4, "message": "measuring"},
    )
    assert beat.status_code == 200 and beat.json()["progress"] == 0.4
    resp = complete(client, job, write_result(tmp_path / "out", program))
    assert resp.status_code == 200 and resp.json()["status"] == "succeeded"

    cfg = client.get(f"/api/v1/models/{model['id']}/config", params={"device": "cpu"})
    assert cfg.status_code == 200 and cfg.json() == config(fingerprint)
    etag = cfg.headers["etag"]
    cached = client.get(f"/api/v1/models/{model['id']}/config", headers={"If-None-Match": etag})
    assert cached.status_code == 304 and cached.content == b""
    by_fp = client.get(f"/api/v1/configs/{fingerprint}")
    assert by_fp.json() == cfg.json() and by_fp.headers["etag"] == etag
    again = client.get(
        f"/api/v1/configs/{fingerprint}",
        headers={"If-None-Match": etag},
    )
    assert again.status_code == 304

    art = client.get(f"/api/v1/models/{model['id']}/artifact", params={"device": "cpu"})
    assert art.status_code == 200 and art.content == program.read_bytes()
    no_aoti = client.get(f"/api/v1/models/{model['id']}/artifact?device=cpu&format=aoti")
    assert no_aoti.status_code == 404
    report = client.get(f"/api/v1/models/{model['id']}/report").json()
    assert report["config"] == config(fingerprint) and report["profiles"]["tuned"] == {
        "ops_per_iter": 4.0
    }
    assert client.get(report["artifacts"]["program"]).content == program.read_bytes()
    trace = client.get(report["artifacts"]["traces"]["baseline"])
    assert trace.status_code == 200 and trace.json()["kind"] == "baseline"
    listed = client.get("/api/v1/models").json()[0]["configs"]
    assert [(c["device"], c["speedup"]) for c in listed] == [("cpu", 1.5)]


def test_a_training_job_gets_its_own_config_beside_the_inference_one(
    client: TestClient, program: Path, fingerprint: str, tmp_path: Path
) -> None:
    """`"mode": "train"` (issue 12): queued, handed to the worker with its optimizer, checked
    on completion, and served under `mode=train` without touching the inference config."""
    model = upload(client, program, tune="true").json()
    jobs = f"/api/v1/models/{model['id']}/jobs"
    for bad in (
        {"device": "cpu", "optimizer": "sgd"},
        {"device": "cpu", "mode": "train", "optimizer": "lbfgs"},
        {"device": "cpu", "mode": "serve"},
        {"device": "cpu", "mode": "train", "sizes": {"batch": [1, 8]}},
    ):
        assert client.post(jobs, json=bad).status_code == 422, bad
    assert upload(client, program, tune="true", optimizer="sgd").status_code == 422
    train = client.post(jobs, json={"device": "cpu", "mode": "train", "optimizer": "sgd"})
    assert train.status_code == 202
    assert (train.json()["mode"], train.json()["optimizer"]) == ("train", "sgd")
    assert train.json()["id"] != model["job"]["id"] and model["job"]["mode"] == "infer"

    infer_job, train_job = claim(client), claim(client)
    assert train_job["job"]["mode"] == "train" and train_job["job"]["optimizer"] == "sgd"
    assert complete(client, infer_job, write_result(tmp_path / "i", program)).status_code == 200
    wrong = complete(client, train_job, write_result(tmp_path / "w", program))
    assert wrong.status_code == 422 and "mode 'infer'" in wrong.json()["detail"]
    adamw = training_config(fingerprint, optimizer="adamw")
    wrong = complete(client, train_job, write_result(tmp_path / "a", program, adamw))
    assert wrong.status_code == 422 and "optimizer adamw" in wrong.json()["detail"]
    trained = training_config(fingerprint, speedup=1.2)
    done = complete(client, train_job, write_result(tmp_path / "t", program, trained))
    assert done.is_success, done.text

    base = f"/api/v1/models/{model['id']}"
    for _ in range(2):  # the second time from the in-memory cache, still kept apart by mode
        assert client.get(f"{base}/config").json() == config(fingerprint)
        assert client.get(f"{base}/config?mode=train").json() == trained
        assert client.get(f"/api/v1/configs/{fingerprint}?mode=train").json() == trained
        assert client.get(f"/api/v1/configs/{fingerprint}").json() == config(fingerprint)
    report = client.get(f"{base}/report", params={"mode": "train"}).json()
    assert report["tuned"]["mode"] == "train" and "mode=train" in report["artifacts"]["program"]
    assert client.get(report["artifacts"]["program"]).status_code == 200
    sites = client.get(f"{base}/sites.csv?mode=train").text.splitlines()
    assert sites[0].startswith("model_id,device,mode,") and ",train," in sites[1]
    listed = client.get(f"/api/v1/models/{model['id']}").json()["configs"]
    assert sorted((c["mode"], c["speedup"]) for c in listed) == [("infer", 1.5), ("train", 1.2)]
    assert client.get(f"{base}/config?mode=bogus").status_code == 422
    other = upload(client, variant(program, tmp_path / "v.pt2", "never trained")).json()
    missing = client.get(f"/api/v1/models/{other['id']}/config?mode=train")
    assert missing.status_code == 404 and "training config" in missing.json()["detail"]


def test_a_stale_lease_gets_409_and_changes_nothing(
    client: TestClient, program: Path, settings: Settings, tmp_path: Path
) -> None:
    upload(client, program, tune="true")
    job = claim(client)
    blobs = blob_count(settings.data_dir)
    stale = {**job, "lease_token": "0" * 32}
    other = variant(program, tmp_path / "other.pt2", "tuned elsewhere")
    resp = complete(client, stale, write_result(tmp_path / "out", other))
    assert resp.status_code == 409 and "not leased" in resp.json()["detail"]
    beat = client.post(f"/api/v1/jobs/{job['job']['id']}/heartbeat", json={"lease_token": "0" * 32})
    assert beat.status_code == 409
    fail = client.post(
        f"/api/v1/jobs/{job['job']['id']}/fail", json={"lease_token": "0" * 32, "error": "x"}
    )
    assert fail.status_code == 409
    assert blob_count(settings.data_dir) == blobs and spool_count(settings.data_dir) == 0
    assert client.get(f"/api/v1/jobs/{job['job']['id']}").json()["status"] == "running"


def test_failures_retry_then_dead_letter(client: TestClient, program: Path) -> None:
    upload(client, program, tune="true")
    job = claim(client)
    resp = client.post(
        f"/api/v1/jobs/{job['job']['id']}/fail",
        json={"lease_token": job["lease_token"], "error": "refused to load x", "retryable": False},
    )
    assert resp.status_code == 200
    body = resp.json()
    assert body["status"] == "failed" and body["error"] == "refused to load x"


def test_a_bad_report_is_refused_and_the_job_stays_leased(
    client: TestClient, program: Path, settings: Settings, tmp_path: Path
) -> None:
    upload(client, program, tune="true")
    job = claim(client)
    blobs = blob_count(settings.data_dir)
    files = write_result(tmp_path / "out", program, cfg={"schema_version": 1})
    resp = complete(client, job, files)
    assert resp.status_code == 422 and "schema" in resp.json()["detail"]
    files["report"].write_text("{not json")
    assert complete(client, job, files).status_code == 422
    report = json.loads(write_result(tmp_path / "nan", program)["report"].read_text())
    report["config"]["whole_model"]["speedup"] = float("inf")
    files["report"].write_text(json.dumps(report))
    refused = complete(client, job, files)
    assert refused.status_code == 422 and "Infinity" in refused.json()["detail"]
    files = write_result(tmp_path / "out2", program)
    files["program"].write_bytes(b"not a zip")
    assert complete(client, job, files).status_code == 422
    assert blob_count(settings.data_dir) == blobs and spool_count(settings.data_dir) == 0
    assert complete(client, job, write_result(tmp_path / "ok", program)).status_code == 200


def _not_a_program(tmp: Path) -> Path:
    path = tmp / "plain.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("readme.txt", "hello")
    return path


BAD_REQUESTS: list[tuple[str, int, Any]] = [
    ("missing file", 422, lambda c, p, t: c.post("/api/v1/models", files={"name": (None, "x")})),
    ("text file", 415, lambda c, p, t: c.post("/api/v1/models", files={"file": ("a.pt2", b"hi")})),
    ("zip but no program", 415, lambda c, p, t: upload(c, _not_a_program(t))),
    ("empty file", 415, lambda c, p, t: c.post("/api/v1/models", files={"file": ("a.pt2", b"")})),
    ("json instead of multipart", 415, lambda c, p, t: c.post("/api/v1/models", json={})),
    ("bad upload option", 422, lambda c, p, t: upload(c, p, tune="true", device="tpu")),
    ("unknown upload field", 422, lambda c, p, t: upload(c, p, colour="red")),
    (
        "field twice",
        400,
        lambda c, p, t: c.post(
            "/api/v1/models", files=[("file", ("a.pt2", b"1")), ("file", ("b.pt2", b"2"))]
        ),
    ),
    (
        "oversize",
        413,
        lambda c, p, t: c.post("/api/v1/models", files={"file": ("big.pt2", b"x" * 700_000)}),
    ),
    (
        "oversize chunked",
        413,
        lambda c, p, t: c.post(
            "/api/v1/models",
            content=(
                b'--b\r\nContent-Disposition: form-data; name="file"; filename="x.pt2"\r\n\r\n'
                if i == 0
                else b"x" * 50_000
                for i in range(30)
            ),
            headers={"content-type": "multipart/form-data; boundary=b"},
        ),
    ),
    (
        "truncated multipart",
        400,
        lambda c, p, t: c.post(
            "/api/v1/models",
            content=b'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\nabc',
            headers={"content-type": "multipart/form-data; boundary=b"},
        ),
    ),
    ("unknown model", 404, lambda c, p, t: c.get("/api/v1/models/999")),
    (
        "unknown model jobs",
        404,
        lambda c, p, t: c.post("/api/v1/models/999/jobs", json={"device": "cpu"}),
    ),
    ("unknown model config", 404, lambda c, p, t: c.get("/api/v1/models/999/config")),
    ("unknown model artifact", 404, lambda c, p, t: c.get("/api/v1/models/999/artifact")),
    ("unknown model report", 404, lambda c, p, t: c.get("/api/v1/models/999/report")),
    ("unknown job", 404, lambda c, p, t: c.get("/api/v1/jobs/999")),
    ("unknown fingerprint", 404, lambda c, p, t: c.get("/api/v1/configs/abc123")),
    ("bad fingerprint", 422, lambda c, p, t: c.get("/api/v1/configs/NOT-HEX")),
    ("non-integer id", 422, lambda c, p, t: c.get("/api/v1/jobs/abc")),
    (
        "bad json",
        400,
        lambda c, p, t: c.post(
            "/api/v1/jobs/claim", content=b"{nope", headers={"content-type": "application/json"}
        ),
    ),
    (
        "bad device",
        422,
        lambda c, p, t: c.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": "tpu"}),
    ),
    (
        "unknown job heartbeat",
        404,
        lambda c, p, t: c.post("/api/v1/jobs/999/heartbeat", json={"lease_token": "x"}),
    ),
    (
        "complete without multipart",
        415,
        lambda c, p, t: c.post("/api/v1/jobs/1/complete", json={"lease_token": "x"}),
    ),
    (
        "complete without token",
        422,
        lambda c, p, t: c.post("/api/v1/jobs/1/complete", files={"report": ("r.json", b"{}")}),
    ),
]


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # fails before the database
@pytest.mark.parametrize(("case", "code", "send"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_a_json_error_and_store_nothing(
    client: TestClient,
    settings: Settings,
    program: Path,
    tmp_path: Path,
    case: str,
    code: int,
    send: Any,
) -> None:
    resp = send(client, program, tmp_path)
    assert resp.status_code == code, resp.text
    assert resp.headers["content-type"] == "application/json"
    assert "detail" in resp.json()
    assert client.get("/api/v1/models").json() == []
    assert client.get("/api/v1/jobs").json() == []
    assert blob_count(settings.data_dir) == 0 and spool_count(settings.data_dir) == 0


def test_missing_file_names_the_field(client: TestClient) -> None:
    resp = client.post("/api/v1/models", files={"name": (None, "x")})
    assert resp.json()["detail"][0]["loc"] == ["body", "file"]


def test_openapi_documents_the_contract(client: TestClient) -> None:
    assert client.get("/docs").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    for path in (
        "/api/v1/models",
        "/api/v1/models/{model_id}/jobs",
        "/api/v1/jobs/{job_id}",
        "/api/v1/models/{model_id}/config",
        "/api/v1/configs/{fingerprint}",
        "/api/v1/models/{model_id}/artifact",
        "/api/v1/models/{model_id}/report",
    ):
        assert path in paths
    upload_body = paths["/api/v1/models"]["post"]["requestBody"]["content"]
    assert "file" in upload_body["multipart/form-data"]["schema"]["properties"]
    assert client.get("/healthz").json()["status"] == "ok"


class TestAuth:
    @pytest.fixture
    def settings(self, tmp_path: Path) -> Settings:
        return Settings(
            data_dir=tmp_path / "data",
            database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
            api_token=TOKEN,
        )

    def client(self, settings: Settings, host: tuple[str, int], token: str | None) -> TestClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return TestClient(
            create_app(settings, checks=in_process_checks),
            base_url=LOCAL,
            client=host,
            headers=headers,
        )

    def test_writes_need_the_token(self, settings: Settings, program: Path) -> None:
        with self.client(settings, LOOPBACK, None) as anon:
            resp = upload(anon, program)
            assert resp.status_code == 401 and resp.headers["www-authenticate"] == "Bearer"
            work = anon.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"})
            assert work.status_code == 401
            assert anon.get("/api/v1/models").status_code == 401  # reads too, from loopback
        with self.client(settings, LOOPBACK, "wrong") as wrong:
            assert upload(wrong, program).status_code == 403
        with self.client(settings, ELSEWHERE, TOKEN) as good:
            assert upload(good, program).status_code == 201
            assert good.get("/api/v1/models").status_code == 200
        assert blob_count(settings.data_dir) == 1

    def test_reads_need_the_token_from_any_address(self, settings: Settings) -> None:
        for host in (LOOPBACK, ELSEWHERE):
            with self.client(settings, host, None) as anon:
                assert anon.get("/api/v1/models").status_code == 401
                assert anon.get("/healthz").status_code == 200
            with self.client(settings, host, TOKEN) as good:
                assert good.get("/api/v1/models").status_code == 200

    def test_without_a_token_only_loopback_gets_in(self, tmp_path: Path, program: Path) -> None:
        settings = Settings(data_dir=tmp_path / "d", database_url=f"sqlite:///{tmp_path / 'x.db'}")
        with self.client(settings, ELSEWHERE, "anything") as remote:
            resp = upload(remote, program)
            assert resp.status_code == 403 and "loopback" in resp.json()["detail"]
            assert remote.get("/api/v1/models").status_code == 403
        with self.client(settings, LOOPBACK, None) as local:
            assert upload(local, program).status_code == 201


def test_job_listing_filters(client: TestClient, program: Path, tmp_path: Path) -> None:
    upload(client, program, tune="true")
    upload(client, variant(program, tmp_path / "b.pt2", "b"), tune="true")
    job = claim(client)
    running = client.get("/api/v1/jobs", params={"status": "running"}).json()
    assert [j["id"] for j in running] == [job["job"]["id"]]
    queued = client.get("/api/v1/jobs", params={"status": "queued"}).json()
    assert len(queued) == 1 and queued[0]["id"] != job["job"]["id"]
    assert json.loads(client.get("/api/v1/jobs?limit=1").content)[0]["id"] == queued[0]["id"]


def test_an_aoti_package_is_stored_only_as_fxtunes_package_for_the_job(
    client: TestClient, program: Path, fingerprint: str, tmp_path: Path
) -> None:
    """Round 3: any zip was stored and served as the tuned package. Now a forged one (a zip of
    anything, or a package built for another model) is refused with nothing stored; the
    package with fxtune's manifest for this model is stored and served (never loaded here)."""
    model = upload(client, program, tune="true").json()
    job = claim(client)
    files = write_result(tmp_path / "out", program)
    forged = tmp_path / "forged.aoti.pt2"
    with zipfile.ZipFile(forged, "w") as zf:
        zf.writestr("x/payload.so", b"\x7fELF")
    other = fake_aoti_package(tmp_path / "other.aoti.pt2", "f" * 32)
    for bad, why in ((forged, "not one AOTInductor writes"), (other, "built for model")):
        resp = complete(client, job, {**files, "aoti": bad})
        assert resp.status_code == 422 and why in resp.json()["detail"], resp.text
    art = client.get(f"/api/v1/models/{model['id']}/artifact?device=cpu&format=aoti")
    assert art.status_code == 404
    package = fake_aoti_package(tmp_path / "tuned.aoti.pt2", fingerprint)
    assert complete(client, job, {**files, "aoti": package}).status_code == 200
    art = client.get(f"/api/v1/models/{model['id']}/artifact?device=cpu&format=aoti")
    assert art.status_code == 200 and art.content == package.read_bytes()
