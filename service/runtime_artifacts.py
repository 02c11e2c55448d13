"""Where a stored config's runtime artifact (`runtime` in the tuned config) is, if stored.

The artifact is a content-addressed blob named by the digest its config records; it was stored
only after the check at completion (`service.api.routes.workers`), so a digest that names no
stored blob (a service that could not check it) is simply not served.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from service.artifacts import ArtifactStore

SUFFIXES = {"onnxruntime": ".onnx", "openvino": ".openvino.zip"}


@dataclass(frozen=True)
class RuntimeFile:
    path: Path
    filename: str  # "tuned.onnx", "tuned.openvino.zip"
    sha256: str


def runtime_file(
    config: dict[str, Any], artifacts: ArtifactStore, sha256: str | None = None
) -> RuntimeFile | None:
    """The config's runtime artifact; None when it has none, it was not stored, or `sha256` is
    given and is not the one the config names."""
    record = config.get("runtime")
    if not isinstance(record, dict):
        return None
    digest, kind = record.get("sha256"), record.get("runtime")
    if not isinstance(digest, str) or kind not in SUFFIXES:
        return None
    if sha256 is not None and digest != sha256:
        return None
    try:
        path = artifacts.path(digest)
    except ValueError:
        return None
    if not path.is_file():
        return None
    return RuntimeFile(path, f"tuned{SUFFIXES[kind]}", digest)
