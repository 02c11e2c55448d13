"""Schemathesis against a live uvicorn: generated requests from /openapi.json, valid and invalid.

Every answer must be documented for its route (status, content type, body and headers), and no
request may produce a 5xx. The service runs without a token on loopback (so every route, worker
routes included, is reachable) with one tuned model, so lookups also find something. Its checks
run in the test's process (tests/service/in_process_checks.py): the subject is the API, and the
seed's upload and result would each cost a sandboxed child importing torch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from service.core.config import Settings
from tests.service.fakes import upload_parts, write_result
from tests.service.helpers import thread_server, tiny_program
from tests.service.in_process_checks import in_process_checks

pytestmark = pytest.mark.e2e

EXAMPLES = 25  # per operation and phase: about a minute on 2 cores
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
TALLY: Counter[str] = Counter()


def seed(url: str, root: Path) -> None:
    program = root / "tiny.pt2"
    tiny_program(program)
    with program.open("rb") as f:
        httpx.post(f"{url}/api/v1/models", files={"file": f}, data={"tune": "true"}, timeout=60)
    claim = httpx.post(f"{url}/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"})
    body = claim.json()
    done = httpx.post(
        f"{url}/api/v1/jobs/{body['job']['id']}/complete",
        data={"lease_token": body["lease_token"]},
        files=upload_parts(write_result(root / "out", program)),
        timeout=60,
    )
    assert done.status_code == 200, done.text


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("fuzz")
    config = Settings(
        data_dir=root / "data",
        database_url=f"sqlite:///{root / 'db.sqlite'}",
        max_upload_mb=1,
        max_result_mb=1,
    )
    with thread_server(config, checks=in_process_checks) as (url, _):
        seed(url, root)
        yield url
    print(f"\nschemathesis: {TALLY.total()} cases; statuses {dict(sorted(TALLY.items()))}")


def app_schema() -> dict[str, Any]:
    """The app's OpenAPI document, built without a server (test collection needs it)."""
    from service.main import create_app

    return create_app(Settings(data_dir=Path("/nonexistent"))).openapi()


# Loaded from the app object at collection; the test checks the live /openapi.json is the same.
# (schemathesis.pytest.from_fixture does not run under this pytest: 'Function' has no _nodeid.)
schema = schemathesis.openapi.from_dict(app_schema())


def test_the_live_document_is_the_one_fuzzed(live_url: str) -> None:
    assert httpx.get(f"{live_url}/openapi.json").json() == app_schema()


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_is_documented_and_none_is_a_server_error(case: Any, live_url: str) -> None:
    response = case.call_and_validate(base_url=live_url, checks=CHECKS, timeout=30)
    TALLY[str(response.status_code)] += 1
    assert response.status_code < 500
