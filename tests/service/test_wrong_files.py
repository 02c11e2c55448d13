"""An upload that is not a torch.export program gets the CLI's message as its 4xx detail, and
nothing is stored."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.core.config import Settings
from service.main import create_app
from tests.service.helpers import LOCAL, blob_count, spool_count, tiny_program
from tests.service.in_process_checks import in_process_checks
from tests.wrong_files import WRONG_FILES, exported_by_old_torch, with_program_json

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # refused before it


@pytest.fixture
def settings(db_url: str, tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", database_url=db_url)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(settings, checks=in_process_checks)
    with TestClient(app, base_url=LOCAL, client=("127.0.0.1", 40000)) as c:
        yield c


def _upload(client: TestClient, path: Path) -> tuple[int, str]:
    with path.open("rb") as f:
        resp = client.post("/api/v1/models", files={"file": (path.name, f)})
    return resp.status_code, resp.json()["detail"]


@pytest.mark.parametrize(("what", "make", "message"), WRONG_FILES, ids=[w[0] for w in WRONG_FILES])
def test_a_wrong_file_gets_415_with_what_to_do(
    client: TestClient,
    settings: Settings,
    tmp_path: Path,
    what: str,
    make: Callable[[Path], Path],
    message: str,
) -> None:
    assert _upload(client, make(tmp_path)) == (415, message)
    assert blob_count(settings.data_dir) == 0 and spool_count(settings.data_dir) == 0


def test_a_program_from_another_torch_names_both(client: TestClient, tmp_path: Path) -> None:
    tiny_program(tmp_path / "tiny.pt2")
    old = with_program_json(tmp_path / "tiny.pt2", tmp_path / "old.pt2", exported_by_old_torch)
    status, detail = _upload(client, old)
    assert status == 415
    assert detail.startswith("this program was exported with torch 2.3.1, and fxtune runs torch")
