"""A byte-level fuzzer over a real `.pt2` zip: flipped, zeroed, inserted and cut bytes anywhere
(local headers, data, central directory). The safe loader must answer each with fxtune's own
error (a 4xx / exit 2-3 upstream) or a clean load, never another exception; a live service must
answer each upload with a 4xx or a 201, never a 5xx."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.crafted import good_program
from tests.service.helpers import sqlite_service
from tuner.contract.errors import FxtuneError
from tuner.loading.load import load_program

counts = {"cases": 0, "refused": 0, "loaded": 0}


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return good_program(tmp_path_factory.mktemp("zipfuzz") / "good.pt2").read_bytes()


def _mutated(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(out))
        kind = rng.choice(["flip", "zero", "insert", "cut", "truncate"])
        if kind == "flip":
            out[at] ^= 1 << rng.randrange(8)
        elif kind == "zero":
            n = rng.randint(1, 16)
            out[at : at + n] = bytes(len(out[at : at + n]))
        elif kind == "insert":
            out[at:at] = rng.randbytes(rng.randint(1, 8))
        elif kind == "cut":
            del out[at : at + rng.randint(1, 64)]
        else:
            del out[at:]
    return bytes(out)


@settings(
    max_examples=int(os.environ.get("FXTUNE_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_loader_answers_every_damaged_zip_with_its_own_error(
    original: bytes, tmp_path: Path, seed: int
) -> None:
    path = tmp_path / f"z{seed}.pt2"
    path.write_bytes(_mutated(original, random.Random(seed)))
    counts["cases"] += 1
    try:
        load_program(path)
        counts["loaded"] += 1
    except FxtuneError:
        counts["refused"] += 1


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sqlite_service(tmp_path_factory.mktemp("zipfuzz-svc")) as url:
        yield url


def test_a_live_service_answers_damaged_uploads_without_a_5xx(
    original: bytes, service: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(23)
    statuses = []
    for i in range(20):
        body = _mutated(original, rng)
        resp = httpx.post(
            f"{service}/api/v1/models", files={"file": (f"z{i}.pt2", body)}, timeout=300
        )
        statuses.append(resp.status_code)
        assert resp.status_code < 500, resp.text
    assert any(400 <= s < 500 for s in statuses)
    with capsys.disabled():
        print(f"\nzip fuzz: loader {counts}; service statuses {sorted(statuses)}")
