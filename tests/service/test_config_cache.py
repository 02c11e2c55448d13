"""Config fetches from the in-memory cache: no database on a hit, fresh after every write, and
at most `config_cache_ttl_s` stale for a second service process sharing the database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.config_cache import ConfigCache
from service.core.config import Settings
from service.main import create_app
from tests.service.fakes import config, program_fingerprint, upload_parts, write_result
from tests.service.helpers import LOCAL, RESULTS_UNCHECKED, tiny_program
from tests.service.in_process_checks import in_process_checks

LOOPBACK = ("127.0.0.1", 40000)
ELSEWHERE = ("203.0.113.9", 40000)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("programs") / "tiny.pt2"
    tiny_program(path)
    return path


def settings_for(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        **{**RESULTS_UNCHECKED, **extra},
    )


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(
        create_app(settings_for(tmp_path, config_cache_ttl_s=600), checks=in_process_checks),
        base_url=LOCAL,
        client=LOOPBACK,
    ) as c:
        yield c


def tune(client: TestClient, program: Path, out: Path, speedup: float) -> dict[str, Any]:
    """Queue a job for the program and complete it with a config of this speedup."""
    with program.open("rb") as f:
        model = client.post("/api/v1/models", files={"file": f}).json()
    client.post(f"/api/v1/models/{model['id']}/jobs", json={"device": "cpu"})
    claim = client.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"}).json()
    cfg = config(program_fingerprint(program), speedup=speedup)
    done = client.post(
        f"/api/v1/jobs/{claim['job']['id']}/complete",
        data={"lease_token": claim["lease_token"]},
        files=upload_parts(write_result(out, program, cfg)),
    )
    assert done.status_code == 200, done.text
    return model


class NoDatabase:
    """Stands in for the store: any call means the request reached the database."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was asked: {name}")


def test_a_cached_config_needs_no_database(
    client: TestClient, program: Path, tmp_path: Path
) -> None:
    model = tune(client, program, tmp_path / "r", 1.5)
    paths = [f"/api/v1/configs/{model['fingerprint']}", f"/api/v1/models/{model['id']}/config"]
    first = {p: client.get(p) for p in paths}  # fills the cache
    app = client.app
    real, app.state.store = app.state.store, NoDatabase()  # type: ignore[attr-defined]
    try:
        for path, resp in first.items():
            etag = resp.headers["etag"]
            same = client.get(path, headers={"If-None-Match": etag})
            assert same.status_code == 304 and same.content == b"" and same.headers["etag"] == etag
            again = client.get(path, params={"device": "cpu"})
            assert again.status_code == 200 and again.content == resp.content
            assert again.json()["whole_model"]["speedup"] == 1.5
            assert again.headers["x-fxtune-hardware-key"] == resp.headers["x-fxtune-hardware-key"]
    finally:
        app.state.store = real  # type: ignore[attr-defined]


def test_a_new_config_replaces_the_cached_one_at_once(
    client: TestClient, program: Path, tmp_path: Path
) -> None:
    model = tune(client, program, tmp_path / "a", 1.5)
    path = f"/api/v1/configs/{model['fingerprint']}"
    old = client.get(path)
    by_model = client.get(f"/api/v1/models/{model['id']}/config")
    tune(client, program, tmp_path / "b", 2.5)  # the same model tuned again
    new = client.get(path, headers={"If-None-Match": old.headers["etag"]})
    assert new.status_code == 200 and new.json()["whole_model"]["speedup"] == 2.5
    assert new.headers["etag"] != old.headers["etag"]
    fresh = client.get(f"/api/v1/models/{model['id']}/config")
    assert (
        fresh.json()["whole_model"]["speedup"] == 2.5 != by_model.json()["whole_model"]["speedup"]
    )


def test_another_process_sees_a_write_within_the_ttl(program: Path, tmp_path: Path) -> None:
    """The reader's cache runs on a clock the test moves: how long the writes take in between
    (a loaded machine took over the TTL once) changes nothing."""
    ttl, now = 0.5, [0.0]
    settings = settings_for(tmp_path, config_cache_ttl_s=ttl, result_check="none")
    with (
        TestClient(
            create_app(settings, checks=in_process_checks), base_url=LOCAL, client=LOOPBACK
        ) as writer,
        TestClient(
            create_app(settings, checks=in_process_checks), base_url=LOCAL, client=LOOPBACK
        ) as reader,
    ):
        reader.app.state.config_cache = ConfigCache(ttl, clock=lambda: now[0])  # type: ignore[attr-defined]
        model = tune(writer, program, tmp_path / "a", 1.5)
        path = f"/api/v1/configs/{model['fingerprint']}"
        assert reader.get(path).json()["whole_model"]["speedup"] == 1.5  # cached in `reader`
        tune(writer, program, tmp_path / "b", 2.5)  # written through the other process
        now[0] += ttl - 0.01
        assert reader.get(path).json()["whole_model"]["speedup"] == 1.5  # within the TTL
        now[0] += 0.02
        assert reader.get(path).json()["whole_model"]["speedup"] == 2.5


def test_the_cache_does_not_bypass_auth(program: Path, tmp_path: Path) -> None:
    settings = settings_for(tmp_path, api_token="u", worker_token="w", config_cache_ttl_s=600)
    app = create_app(settings, checks=in_process_checks)
    with TestClient(app, base_url=LOCAL, client=LOOPBACK) as local:
        local.headers["Authorization"] = "Bearer u"
        with program.open("rb") as f:
            model = local.post("/api/v1/models", files={"file": f}, data={"tune": "true"}).json()
        worker = {"Authorization": "Bearer w"}
        body = {"worker_id": "w", "device": "cpu"}
        claim = local.post("/api/v1/jobs/claim", json=body, headers=worker).json()
        done = local.post(
            f"/api/v1/jobs/{claim['job']['id']}/complete",
            data={"lease_token": claim["lease_token"]},
            files=upload_parts(write_result(tmp_path / "r", program)),
            headers=worker,
        )
        assert done.status_code == 200, done.text
        path = f"/api/v1/configs/{model['fingerprint']}"
        assert local.get(path).status_code == 200  # now cached
        remote = TestClient(app, base_url=LOCAL, client=ELSEWHERE)
        assert remote.get(path).status_code == 401
        assert remote.get(path, headers={"Authorization": "Bearer nope"}).status_code == 403
        assert remote.get(path, headers={"Authorization": "Bearer u"}).status_code == 200
        foreign = TestClient(app, base_url="http://attacker.example", client=LOOPBACK)
        assert foreign.get(path).status_code == 403
