"""Inputs that once gave 500s or stored something harmful: each is a clear 4xx or made harmless."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.core.config import Settings
from service.main import create_app
from tests.service.fakes import upload_parts, write_result
from tests.service.helpers import LOCAL, RESULTS_UNCHECKED, blob_count, spool_count, tiny_program
from tests.service.in_process_checks import in_process_checks

LOOPBACK = ("127.0.0.1", 40000)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("programs") / "tiny.pt2"
    tiny_program(path)
    return path


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=db_url, **RESULTS_UNCHECKED)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(
        create_app(settings, checks=in_process_checks),
        base_url=LOCAL,
        client=LOOPBACK,
        raise_server_exceptions=False,
    ) as c:
        yield c


def upload(client: TestClient, path: Path, filename: str | None = None, **fields: str) -> object:
    with path.open("rb") as f:
        return client.post(
            "/api/v1/models", files={"file": (filename or path.name, f)}, data=fields
        )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_malformed_multipart_body_is_a_400(client: TestClient, settings: Settings) -> None:
    bodies = [
        b'--b\r\nContent-Disposition: form-data; name="file"\r\n\r\nabc\r\n--bX',
        b"garbage before any boundary\r\n--b\r\n",
        b"--b\r\nno-colon-header\r\n\r\nx\r\n--b--\r\n",
    ]
    for body in bodies:
        resp = client.post(
            "/api/v1/models",
            content=body,
            headers={"content-type": "multipart/form-data; boundary=b"},
        )
        assert resp.status_code == 400, (body, resp.text)
        assert "detail" in resp.json()
    assert spool_count(settings.data_dir) == 0 and blob_count(settings.data_dir) == 0


BIG = [2**63, 2**63 - 1 + 10, 10**30, -1, 0]


@pytest.mark.parametrize("ident", BIG)
def test_ids_outside_int64_are_4xx_never_500(client: TestClient, ident: int) -> None:
    for method, path in [
        ("GET", f"/api/v1/models/{ident}"),
        ("GET", f"/api/v1/models/{ident}/config"),
        ("GET", f"/api/v1/models/{ident}/artifact"),
        ("GET", f"/api/v1/models/{ident}/file"),
        ("GET", f"/api/v1/models/{ident}/report"),
        ("GET", f"/api/v1/models/{ident}/sites.csv"),
        ("GET", f"/api/v1/jobs/{ident}"),
        ("GET", f"/api/v1/jobs?model_id={ident}"),
        ("GET", f"/api/v1/jobs?offset={ident}"),
        ("GET", f"/api/v1/models?offset={ident}"),
        ("GET", f"/models/{ident}"),
        ("POST", f"/api/v1/jobs/{ident}/heartbeat"),
        ("POST", f"/api/v1/models/{ident}/jobs"),
    ]:
        body = {"lease_token": "x"} if path.endswith("heartbeat") else {"device": "cpu"}
        resp = client.request(method, path, json=body if method == "POST" else None)
        allowed = {200, 422} if "?" in path else {404, 422}  # lists: an empty page or a 422
        assert resp.status_code in allowed, (path, resp.status_code, resp.text)
        assert "detail" in resp.json() or resp.status_code == 200


def test_a_non_ascii_lease_token_is_a_conflict_not_a_crash(
    client: TestClient, program: Path, tmp_path: Path
) -> None:
    upload(client, program, tune="true")
    claim = client.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"}).json()
    job = claim["job"]["id"]
    for token in ("ü" * 32, "токен", "\u2603"):
        beat = client.post(f"/api/v1/jobs/{job}/heartbeat", json={"lease_token": token})
        assert beat.status_code in (409, 422), beat.text
        fail = client.post(f"/api/v1/jobs/{job}/fail", json={"lease_token": token, "error": "e"})
        assert fail.status_code in (409, 422), fail.text
        done = client.post(
            f"/api/v1/jobs/{job}/complete",
            data={"lease_token": token},
            files=upload_parts(write_result(tmp_path / "out", program)),
        )
        assert done.status_code in (409, 422), done.text
    assert client.get(f"/api/v1/jobs/{job}").json()["status"] == "running"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_names_are_capped_after_dropping_path_parts(
    client: TestClient, program: Path, tmp_path: Path
) -> None:
    long_file = "a/b/../" + "x" * 3000 + ".pt2"
    first = upload(client, program, filename=long_file).json()
    assert first["name"] == "x" * 255
    from tests.service.helpers import variant

    other = variant(program, tmp_path / "v.pt2", "v")
    win = upload(client, other, filename="C:\\Users\\me\\secret\\resnet.pt2").json()
    assert win["name"] == "resnet"
    too_long = upload(client, variant(program, tmp_path / "w.pt2", "w"), name="n" * 256)
    assert too_long.status_code == 422
    assert all(len(m["name"]) <= 255 for m in client.get("/api/v1/models").json())


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_csv_cells_that_a_spreadsheet_would_run_are_neutralized(
    client: TestClient, program: Path, tmp_path: Path
) -> None:
    from tests.service.fakes import config, program_fingerprint
    from tests.service.helpers import variant

    names = ['=HYPERLINK("http://x")', "+1+1", "-2", "@SUM(A1)", "plain"]
    for i, name in enumerate(names):
        path = variant(program, tmp_path / f"{i}.pt2", str(i))
        assert upload(client, path, name=name, tune="true").status_code == 201
    fingerprint = program_fingerprint(program)
    for i, _ in enumerate(names):
        claim = client.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"}).json()
        hardware = {"name": "\t=cmd|' /c calc'!A1" if i % 2 else "\r-1"}
        files = write_result(tmp_path / f"r{i}", program, config(fingerprint, **hardware))
        resp = client.post(
            f"/api/v1/jobs/{claim['job']['id']}/complete",
            data={"lease_token": claim["lease_token"]},
            files=upload_parts(files),
        )
        assert resp.status_code == 200, resp.text
    text = client.get("/api/v1/exports/models.csv").text
    rows = list(csv.DictReader(io.StringIO(text, newline="")))
    assert {r["model"] for r in rows} == {"'" + n if n[0] in "=+-@" else n for n in names}
    for row in rows:
        for value in row.values():
            assert not value or value[0] not in "=+-@\t\r", row
    assert all(float(r["speedup"]) == 1.5 for r in rows)  # numbers stay numbers
    model_id = rows[0]["model_id"]
    sites = client.get(f"/api/v1/models/{model_id}/sites.csv").text
    for row in csv.DictReader(io.StringIO(sites, newline="")):
        assert all(not v or v[0] not in "=+-@\t\r" for v in row.values()), row


def test_neutralize_prefixes_every_formula_start() -> None:
    from service.api.routes.exports import neutralize

    for start in ("=", "+", "-", "@", "\t", "\r"):
        assert neutralize(start + "1") == "'" + start + "1"
    assert neutralize("x=1") == "x=1" and neutralize(-2.5) == -2.5 and neutralize(None) is None


def test_startup_removes_every_dead_spool_but_not_a_live_one(tmp_path: Path) -> None:
    from service.artifacts import ArtifactStore

    store = ArtifactStore(tmp_path / "artifacts")
    live = store.spool(1 << 20, "live.pt2")
    live.write(b"in flight")
    dead = store.tmp / "upload-dead.part"  # what kill -9 leaves: a fresh file nobody holds
    dead.write_bytes(b"half an upload")
    assert store.clear_tmp() == 1
    assert not dead.exists() and live.path.exists()
    live.discard()
    assert list(store.tmp.iterdir()) == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_openapi_lists_the_error_statuses_of_each_route(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    expected = {
        ("/api/v1/models", "post"): {"400", "401", "403", "413", "415", "422", "500", "503"},
        ("/api/v1/models/{model_id}", "get"): {"403", "404", "422"},
        ("/api/v1/models/{model_id}/jobs", "post"): {"400", "403", "404", "422"},
        ("/api/v1/jobs/{job_id}/complete", "post"): {"400", "401", "403", "404", "409", "413"}
        | {"500", "503"},
        ("/api/v1/jobs/{job_id}/heartbeat", "post"): {"403", "404", "409", "422"},
        ("/api/v1/configs/{fingerprint}", "get"): {"304", "403", "404", "422"},
        ("/api/v1/models/{model_id}/sites.csv", "get"): {"403", "404", "422"},
    }
    for (path, method), codes in expected.items():
        documented = set(paths[path][method]["responses"])
        assert codes <= documented, (path, codes - documented)
    for path, operations in paths.items():
        for method, op in operations.items():
            assert "403" in op["responses"], (path, method)  # the Host check answers anywhere
            error = op["responses"]["403"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/ErrorOut"}
