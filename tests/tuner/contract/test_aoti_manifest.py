"""An AOTInductor package is stored only as fxtune's package for the job (never loaded)."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from tuner.contract.aoti_manifest import (
    MANIFEST,
    Expected,
    PackageRefused,
    add_manifest,
    check_package,
    manifest_for,
)

FP = "0" * 32
EXPECTED = Expected(FP, "cpu")
MODEL = "data/aotinductor/model"
METADATA = json.dumps({"AOTI_DEVICE_KEY": "cpu", "AOTI_PLATFORM": "linux"}).encode()


def members(device: str = "cpu") -> dict[str, bytes]:
    return {
        "archive_format": b"pt2",
        "archive_version": b"0",
        ".data/version": b"1",
        f"{MODEL}/abc.wrapper.cpp": b"// wrapper",
        f"{MODEL}/abc.wrapper.so": b"\x7fELF...",
        f"{MODEL}/abc.wrapper_metadata.json": METADATA.replace(b'"cpu"', f'"{device}"'.encode()),
    }


def package(path: Path, files: dict[str, bytes], manifest: bytes | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(f"tuned.aoti/{name}", data)
        if manifest is not None:
            zf.writestr(f"tuned.aoti/{MANIFEST}", manifest)
    return path


def test_a_package_with_its_manifest_passes(tmp_path: Path) -> None:
    path = package(tmp_path / "p.pt2", members())
    add_manifest(path, EXPECTED, "2.13.0")
    manifest = check_package(path, EXPECTED)
    assert manifest["model_fingerprint"] == FP and len(manifest["files"]) == len(members())


def _forged(tmp_path: Path, kind: str) -> Path:
    good = members()
    signed = manifest_for(good, EXPECTED, "2.13.0")
    path = tmp_path / f"{kind}.pt2"
    if kind == "any_zip":
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("x/payload.sh", b"#!/bin/sh")
        return path
    if kind == "no_manifest":
        return package(path, good)
    if kind == "other_model":
        return package(path, good, manifest_for(good, Expected("1" * 32, "cpu"), "2.13.0"))
    if kind == "swapped_library":
        return package(path, {**good, f"{MODEL}/abc.wrapper.so": b"other code"}, signed)
    if kind == "extra_member":
        return package(path, {**good, f"{MODEL}/evil.so": b"x"}, signed)
    if kind == "unknown_member":
        extra = {**good, "lib/evil.so": b"x"}
        return package(path, extra, manifest_for(extra, EXPECTED, "2.13.0"))
    if kind == "other_device":
        cuda = members("cuda")
        return package(path, cuda, manifest_for(cuda, EXPECTED, "2.13.0"))
    if kind == "traversal":
        bad = {**good, "data/aotinductor/../../x.so": b"x"}
        return package(path, bad, manifest_for(bad, EXPECTED, "2.13.0"))
    if kind == "compressed":
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in good.items():
                zf.writestr(f"tuned.aoti/{name}", data)
            zf.writestr(f"tuned.aoti/{MANIFEST}", signed)
        return path
    if kind == "not_a_zip":
        path.write_bytes(b"not a zip")
        return path
    raise AssertionError(kind)


FORGED = {
    "any_zip": "not one AOTInductor writes",
    "no_manifest": "no fxtune manifest",
    "other_model": "built for model",
    "swapped_library": "is not the file its manifest lists",
    "extra_member": "manifest and its members differ",
    "unknown_member": "not one AOTInductor writes",
    "other_device": "says device 'cuda'",
    "traversal": "not accepted",
    "compressed": "compressed",
    "not_a_zip": "not a readable zip",
}


@pytest.mark.parametrize("kind", sorted(FORGED))
def test_a_forged_package_is_refused(tmp_path: Path, kind: str) -> None:
    with pytest.raises(PackageRefused, match=FORGED[kind]):
        check_package(_forged(tmp_path, kind), EXPECTED)
