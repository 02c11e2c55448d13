"""What an AOTInductor package fxtune ships holds, and the check that it holds only that.

A package is native code a worker built (its `.so` runs in the deployment that loads it), and a
worker runs untrusted programs, so the service never loads one: it checks its structure instead,
before storing it, against the job it claims to be for. The tuner writes a manifest into every
package it ships (`fxtune/manifest.json`: the model's fingerprint, the device kind, torch's
version, and the SHA-256 of every other member), and `check_package` refuses a package whose
members are not the ones AOTInductor writes (stored, under one root, no path tricks), whose
manifest is missing or disagrees with its members, or that was built for another model or
device. This stops a forged or swapped file (a zip of anything) from being served as the tuned
package; it cannot tell a well-formed package from a malicious worker's, which is why a
deployment that loads packages trusts the workers (docs/service.md, "Who is trusted with what").
Torch-free: the service runs it in its own process.
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MANIFEST = "fxtune/manifest.json"
FORMAT = "fxtune-aoti-manifest/1"
MAX_MEMBERS = 2000
MAX_BYTES = 16 * 1024**3

# Relative to the package's root folder: what torch's AOTInductor packager writes.
_FIXED = frozenset(
    {"archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id"}
)
_MODEL_FILE = re.compile(
    r"data/aotinductor/[A-Za-z0-9_]{1,64}/[A-Za-z0-9_.\-]{1,200}"
    r"\.(?:cpp|h|so|json|cubin|fatbin|hsaco|spv|o|bin)"
)
_CONSTANT = re.compile(r"data/constants/[A-Za-z0-9_.\-]{1,200}")
_ROOT = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


class PackageRefused(ValueError):
    """The package is not one fxtune shipped for this job; the message says why."""


@dataclass(frozen=True)
class Expected:
    """What the package must have been built for."""

    fingerprint: str
    device: str  # the device kind: cpu, cuda, xla


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_for(members: dict[str, bytes], expected: Expected, torch_version: str) -> bytes:
    """The manifest of a package whose members (relative to its root) are `members`."""
    document = {
        "format": FORMAT,
        "model_fingerprint": expected.fingerprint,
        "device": expected.device,
        "torch": torch_version,
        "files": {name: _digest(data) for name, data in sorted(members.items())},
    }
    return json.dumps(document, indent=1).encode()


def add_manifest(path: Path, expected: Expected, torch_version: str) -> None:
    """Write the manifest into the package at `path` (once, after AOTInductor built it)."""
    with zipfile.ZipFile(path) as zf:
        root = _root_of(zf.namelist())
        members = {n[len(root) + 1 :]: zf.read(n) for n in zf.namelist() if not n.endswith("/")}
    members.pop(MANIFEST, None)
    with zipfile.ZipFile(path, "a") as zf:
        zf.writestr(f"{root}/{MANIFEST}", manifest_for(members, expected, torch_version))


def _root_of(names: list[str]) -> str:
    roots = {n.split("/", 1)[0] for n in names}
    if len(roots) != 1 or not _ROOT.fullmatch(next(iter(roots))):
        raise PackageRefused("its members are not under one root folder")
    return next(iter(roots))


def _members(zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    infos = zf.infolist()
    if not infos or len(infos) > MAX_MEMBERS:
        raise PackageRefused(f"it has {len(infos)} members (1 to {MAX_MEMBERS})")
    root = _root_of([i.filename for i in infos])
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        rel = info.filename[len(root) + 1 :]
        if info.is_dir():
            continue
        if info.compress_type != zipfile.ZIP_STORED:
            raise PackageRefused(f"member {rel!r} is compressed (AOTInductor stores its members)")
        if ".." in rel.split("/") or "\\" in rel or rel in members:
            raise PackageRefused(f"member name {rel!r} is not accepted")
        known = rel in _FIXED or rel == MANIFEST
        if not (known or _MODEL_FILE.fullmatch(rel) or _CONSTANT.fullmatch(rel)):
            raise PackageRefused(f"member {rel!r} is not one AOTInductor writes")
        members[rel] = info
    if sum(i.file_size for i in members.values()) > MAX_BYTES:
        raise PackageRefused("its members hold more than a package can")
    return members


def _manifest(data: bytes) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError:
        raise PackageRefused("its manifest is not JSON") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise PackageRefused("its manifest is not an fxtune package manifest")
    files = document.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise PackageRefused("its manifest lists no files")
    return document


def check_package(path: Path, expected: Expected) -> dict[str, Any]:
    """Refuse (PackageRefused) a package that is not a well-formed AOTInductor package with
    fxtune's manifest for `expected`; its manifest when it is."""
    try:
        with zipfile.ZipFile(path) as zf:
            members = _members(zf)
            if MANIFEST not in members:
                raise PackageRefused("it has no fxtune manifest (fxtune/manifest.json)")
            manifest = _manifest(zf.read(members[MANIFEST]))
            listed = manifest["files"]
            present = set(members) - {MANIFEST}
            if set(listed) != present:
                odd = sorted(set(listed) ^ present)[:3]
                raise PackageRefused(f"its manifest and its members differ ({', '.join(odd)})")
            if not any(name.endswith(".so") for name in present):
                raise PackageRefused("it holds no compiled model library")
            for name in sorted(present):
                if _digest(zf.read(members[name])) != listed[name]:
                    raise PackageRefused(f"member {name!r} is not the file its manifest lists")
                if name.endswith("_metadata.json"):
                    _check_metadata(zf.read(members[name]), expected, name)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise PackageRefused(f"it is not a readable zip ({exc})") from None
    if manifest.get("model_fingerprint") != expected.fingerprint:
        raise PackageRefused(
            f"it was built for model {manifest.get('model_fingerprint')!r}, not "
            f"{expected.fingerprint!r}"
        )
    if manifest.get("device") != expected.device:
        raise PackageRefused(f"it was built for {manifest.get('device')!r}, not {expected.device}")
    return manifest


def _check_metadata(data: bytes, expected: Expected, name: str) -> None:
    try:
        metadata = json.loads(data)
    except ValueError:
        raise PackageRefused(f"{name} is not JSON") from None
    device = metadata.get("AOTI_DEVICE_KEY") if isinstance(metadata, dict) else None
    if device != expected.device:
        raise PackageRefused(f"{name} says device {device!r}, not {expected.device}")
