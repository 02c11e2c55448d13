"""Damaged zips are bad input everywhere: a 4xx with a reason from a live service, exit 2 or 3
from `fxtune sites`, never a 500 or a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.crafted import good_program
from tests.malformed_zips import RAW_ERROR, VARIANTS, read_program_json
from tests.service.helpers import REPO, fxtune_env, sqlite_service
from tuner.contract.errors import ArtifactFormatError, UnsafeArtifactError
from tuner.loading.archive import open_archive

WHY = {
    "bad_crc": "damaged",
    "bad_deflate": "damaged",
    "encrypted": "encrypted",
    "renamed_locally": "local header",
    "oversized": "damaged",
}


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return good_program(tmp_path_factory.mktemp("good") / "good.pt2")


@pytest.fixture(scope="module")
def malformed(good: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("malformed")
    return {name: build(good, root / f"{name}.pt2") for name, build in VARIANTS.items()}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with sqlite_service(tmp_path_factory.mktemp("svc")) as url:
        yield url


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_each_variant_is_really_damaged(malformed: dict[str, Path], good: Path, name: str) -> None:
    """The control: plain zipfile raises its raw error on each, and reads the original."""
    assert read_program_json(good).startswith(b"{")
    with pytest.raises(RAW_ERROR[name]):
        read_program_json(malformed[name])


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_safe_reader_maps_each_to_a_format_or_safety_error(
    malformed: dict[str, Path], name: str
) -> None:
    with pytest.raises((ArtifactFormatError, UnsafeArtifactError), match=WHY[name]):
        archive = open_archive(malformed[name])
        archive.read("models/model.json")


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_an_upload_of_each_is_a_4xx_with_the_reason(
    service: str, malformed: dict[str, Path], name: str
) -> None:
    with malformed[name].open("rb") as f:
        resp = httpx.post(
            f"{service}/api/v1/models", files={"file": (f"{name}.pt2", f)}, timeout=60
        )
    assert resp.status_code in (415, 422), resp.text
    assert WHY[name] in resp.json()["detail"]
    assert httpx.get(f"{service}/api/v1/models").json() == []


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_fxtune_sites_exits_2_or_3_without_a_traceback(
    malformed: dict[str, Path], name: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fxtune_cli", "sites", str(malformed[name])],
        cwd=REPO,
        env=fxtune_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (2, 3), proc.stderr
    assert "Traceback" not in proc.stderr
    assert WHY[name] in proc.stderr
