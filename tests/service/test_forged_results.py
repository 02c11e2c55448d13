"""Issue 18's forged completion: a result whose program has the job's graph (so its fingerprint)
but other weights is refused before anything is stored, by a real check in a child process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.core.config import Settings
from tests.service.fakes import config, program_fingerprint, upload_parts, write_result
from tests.service.helpers import thread_server, tiny_program


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db'}")
    with thread_server(settings) as (url, _app):
        yield url, tmp_path


def _complete(url: str, job: dict, files: dict[str, Path]) -> httpx.Response:
    return httpx.post(
        f"{url}/api/v1/jobs/{job['job']['id']}/complete",
        data={"lease_token": job["lease_token"]},
        files=upload_parts(files),
        timeout=300,
    )


def test_a_forged_program_is_refused_and_the_genuine_one_stored(
    service: tuple[str, Path],
) -> None:
    url, tmp = service
    genuine, forged = tmp / "genuine.pt2", tmp / "forged.pt2"
    tiny_program(genuine, seed=0)
    tiny_program(forged, seed=1)  # same graph and shapes: the same fingerprint, other weights
    fingerprint = program_fingerprint(genuine)
    assert program_fingerprint(forged) == fingerprint
    with genuine.open("rb") as f:
        model = httpx.post(
            f"{url}/api/v1/models",
            files={"file": ("m.pt2", f)},
            data={"tune": "true"},
            timeout=120,  # the check's child may still be starting, on a loaded machine
        ).json()
    job = httpx.post(f"{url}/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"}).json()
    cfg = config(fingerprint) | {"passes": []}

    refused = _complete(url, job, write_result(tmp / "f", forged, cfg))
    assert refused.status_code == 422, refused.text
    assert "does not answer as the original upload does" in refused.json()["detail"]
    artifact = httpx.get(f"{url}/api/v1/models/{model['id']}/artifact", params={"device": "cpu"})
    assert artifact.status_code == 404

    stored = _complete(url, job, write_result(tmp / "g", genuine, cfg))  # the control
    assert stored.status_code == 200, stored.text
    artifact = httpx.get(f"{url}/api/v1/models/{model['id']}/artifact", params={"device": "cpu"})
    assert artifact.status_code == 200 and artifact.content == genuine.read_bytes()
