"""A live service checks uploads with its warm checker (the real `tuner.checks.inspect warm`):
the upload's check is done by a child that was started, sandboxed and warmed up before the upload
arrived, and the crafted programs are refused through it as they are by a cold child."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.analysis import ProgramAnalysis, UnloadableProgram
from service.core.config import Settings
from tests.crafted import CODE_MARKER, WHY
from tests.service.helpers import REPO, pid_alive, thread_server, tiny_program

READY_S = 180  # a child importing torch, on a loaded 2-core machine
# One of each kind through the warm child, which runs the same check as a cold one: every bomb
# and code route is refused by a cold child in test_hostile_uploads.py and by the loader in
# tests/tuner/loading (each warm check here costs a child importing torch, 2.3 s of CPU).
CODE_ROUTE = "expression_exec"
BOMB = "zeros_bomb"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(REPO))  # the children run this checkout's checks
        root = tmp_path_factory.mktemp("warm")
        db = f"sqlite:///{root / 'db.sqlite'}"
        with thread_server(
            Settings(data_dir=root / "data", database_url=db, warm_checkers=1)
        ) as live:
            yield live


def analysis_of(app: Any) -> ProgramAnalysis:
    analysis: ProgramAnalysis = app.state.analysis
    assert analysis.pool is not None, "the service was started with one warm checker"
    assert analysis.pool.wait_ready(READY_S), "the warm checker did not get ready"
    return analysis


def upload(url: str, path: Path) -> httpx.Response:
    with path.open("rb") as f:
        return httpx.post(f"{url}/api/v1/models", files={"file": (path.name, f)}, timeout=120)


def test_uploads_are_checked_by_a_child_started_before_them(
    service: tuple[str, Any], tmp_path: Path
) -> None:
    url, app = service
    for seed in (1, 2):
        analysis = analysis_of(app)
        (waiting,) = analysis.pool.waiting_pids()  # type: ignore[union-attr]
        tiny_program(tmp_path / f"tiny{seed}.pt2", seed=seed)
        resp = upload(url, tmp_path / f"tiny{seed}.pt2")
        assert resp.status_code == 201, resp.text
        run = analysis.recent[-1]
        assert run.warm and run.was_ready and run.pid == waiting
        assert not pid_alive(waiting)
        assert resp.json()["fingerprint"]


def test_a_resource_bomb_is_refused_through_the_warm_checker(
    service: tuple[str, Any], hostile: dict[str, Path]
) -> None:
    url, app = service
    analysis = analysis_of(app)
    resp = upload(url, hostile[BOMB])
    assert resp.status_code == 422, resp.text
    assert WHY[BOMB] in resp.json()["detail"]
    assert analysis.recent[-1].warm and analysis.recent[-1].was_ready


def test_a_code_route_is_refused_by_the_warm_checker_itself(
    service: tuple[str, Any], hostile: dict[str, Path]
) -> None:
    """The service's cheap archive check refuses these before any child; here the warm child
    gets one directly, and its own schema check refuses it without running anything."""
    _, app = service
    analysis = analysis_of(app)
    with pytest.raises(UnloadableProgram, match="cannot be loaded safely") as refused:
        analysis.fingerprint(hostile[CODE_ROUTE])
    assert WHY[CODE_ROUTE] in str(refused.value)
    assert analysis.recent[-1].warm and analysis.recent[-1].was_ready
    assert not (hostile["good"].parent / CODE_MARKER).exists()


def test_control_the_warm_checker_accepts_the_program_the_bombs_are_made_from(
    service: tuple[str, Any], hostile: dict[str, Path]
) -> None:
    _, app = service
    analysis = analysis_of(app)
    assert analysis.fingerprint(hostile["good"])
    assert analysis.recent[-1].warm
