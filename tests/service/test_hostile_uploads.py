"""Every hostile file is refused at upload by a live service: a 422 that says why, nothing run,
nothing stored, no spool left."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.core.config import Settings
from tests.crafted import CODE_MARKER, MARKER_ENV, WHY
from tests.service.helpers import thread_server


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("svc")
    settings = Settings(data_dir=root / "data", database_url=f"sqlite:///{root / 'db.sqlite'}")
    with thread_server(settings) as (url, _app):
        yield url, root / "data"


@pytest.mark.parametrize("name", sorted(WHY))
def test_a_hostile_upload_is_refused_and_leaves_nothing(
    service: tuple[str, Path],
    hostile: dict[str, Path],
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, data = service
    marker = tmp_path / "marker"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    with hostile[name].open("rb") as f:
        resp = httpx.post(
            f"{url}/api/v1/models",
            files={"file": (f"{name}.pt2", f)},
            data={"tune": "true"},
            timeout=120,
        )
    assert resp.status_code == 422, resp.text
    assert WHY[name] in resp.json()["detail"]
    assert httpx.get(f"{url}/api/v1/models").json() == []
    assert not marker.exists()
    assert not (hostile["good"].parent / CODE_MARKER).exists()
    assert not [p for p in data.rglob("*") if p.is_file() and p.suffix in (".part", ".pt2")]
