"""The upload side of the program fuzzer: mutants of a real program's JSON uploaded to a live
service get a 4xx with a reason or a 201, never a 5xx, and run no code (no marker file)."""

from __future__ import annotations

import json
import random
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.crafted import dynamic_program, rewrite
from tests.program_mutants import mutate
from tests.service.helpers import sqlite_service

MUTANTS = 12


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sqlite_service(tmp_path_factory.mktemp("fuzz-svc")) as url:
        yield url


def test_uploaded_mutants_get_a_4xx_or_201_and_run_nothing(service: str, tmp_path: Path) -> None:
    src = dynamic_program(tmp_path / "dynamic.pt2")
    with zipfile.ZipFile(src) as zf:
        member = next(n for n in zf.namelist() if n.endswith("models/model.json"))
        program: dict[str, Any] = json.loads(zf.read(member))
    rng = random.Random(18)
    marker = tmp_path / "marker"
    statuses = []
    for i in range(MUTANTS):
        raw = json.dumps(mutate(program, rng, marker)).encode()
        dst = rewrite(src, tmp_path / f"m{i}.pt2", lambda n, d, raw=raw: raw if n == member else d)
        with dst.open("rb") as f:
            resp = httpx.post(
                f"{service}/api/v1/models", files={"file": (dst.name, f)}, timeout=300
            )
        statuses.append(resp.status_code)
        assert resp.status_code in (200, 201) or 400 <= resp.status_code < 500, resp.text
        if resp.status_code >= 400:
            assert resp.json()["detail"], resp.text
        assert not marker.exists()
    assert any(400 <= s < 500 for s in statuses), statuses  # the payloads did reach the checks
