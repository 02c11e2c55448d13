"""An internal failure while checking an upload is the server's fault: a 5xx with a JSON detail
and nothing stored, never the 4xx that says the file is bad (nor a bare 500 page)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

import service.analysis
import service.api.routes.models
from service.core.config import Settings
from service.main import create_app
from tests.service.helpers import LOCAL, blob_count, spool_count, tiny_program
from tuner.contract.exit_codes import ExitCode
from tuner.host.sandbox import ChildResult

LOOPBACK = ("127.0.0.1", 40000)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("programs") / "tiny.pt2"
    tiny_program(path)
    return path


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def client(data_dir: Path, tmp_path: Path) -> Iterator[TestClient]:
    # Cold checks (warm_checkers=0): the tests plant the child's result through `run_child`; the
    # warm path maps a child's exit through the same function (tests/service/test_warm_checkers.py).
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings = Settings(data_dir=data_dir, database_url=db, warm_checkers=0)
    with TestClient(create_app(settings), base_url=LOCAL, client=LOOPBACK) as c:
        yield c


def upload(client: TestClient, path: Path) -> Any:
    with path.open("rb") as f:
        return client.post("/api/v1/models", files={"file": (path.name, f)})


def _nothing_stored(client: TestClient, data_dir: Path) -> bool:
    models = client.get("/api/v1/models").json()
    return models == [] and blob_count(data_dir) == 0 and spool_count(data_dir) == 0


def test_a_bug_in_the_archive_check_is_a_500_with_a_detail(
    client: TestClient, data_dir: Path, program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def planted(_path: object) -> None:
        raise AttributeError("a planted bug in the archive check")

    not_a_zip = program.with_name("notes.pt2")
    not_a_zip.write_text("hello")
    assert upload(client, not_a_zip).status_code == 415  # the control: a bad file is the client's
    monkeypatch.setattr(service.api.routes.models, "check_archive", planted)
    resp = upload(client, program)
    assert resp.status_code == 500
    assert "internal error" in resp.json()["detail"]
    assert "planted" not in resp.json()["detail"]  # the server's internals stay in its log
    assert _nothing_stored(client, data_dir)


@pytest.mark.parametrize(
    ("child", "status"),
    [
        (ChildResult(ExitCode.INTERNAL, "AttributeError: a planted bug"), 500),
        (ChildResult(127, "cannot start the tuner"), 500),
        (ChildResult(ExitCode.USER_INPUT, "error: its shapes do not propagate"), 422),
        (ChildResult(ExitCode.REFUSED, "error: refused: node zeros"), 422),
        (ChildResult(-24, "tuner killed by SIGXCPU"), 422),  # its CPU limit: the file's cost
        (ChildResult(-9, "tuner killed by SIGKILL", timed_out=True), 422),
    ],
)
def test_the_checkers_exit_decides_between_the_files_fault_and_the_servers(
    client: TestClient,
    data_dir: Path,
    program: Path,
    monkeypatch: pytest.MonkeyPatch,
    child: ChildResult,
    status: int,
) -> None:
    monkeypatch.setattr(service.analysis, "run_child", lambda *_a, **_k: child)
    resp = upload(client, program)
    assert resp.status_code == status, resp.text
    detail = resp.json()["detail"]
    assert ("internal error" in detail) == (status == 500)
    assert _nothing_stored(client, data_dir)
