"""The service's check of a runtime artifact from a worker (`python -m tuner.checks.inspect
runtime RUNTIME FILE`): data only, or refused.

The artifact is parsed, never run: an ONNX file with the `onnx` package and its checker, an
OpenVINO IR zip member by member and its XML with the standard library
(`tuner.backends.runtime_files`), then, where OpenVINO is installed, with OpenVINO's own reader
(no extension is ever added to its Core, so an IR that needs one fails to read), every
operation of the model it reads from a standard opset. A check that cannot run here (the
`onnx` package missing) says so instead of refusing: the service then stores the result
without the artifact, and deployments run the config's fallback.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tuner.backends.runtime_files import (
    ArtifactCheckUnavailable,
    check_artifact,
    read_openvino_zip,
)
from tuner.contract.errors import UnsafeArtifactError

_OPSET = re.compile(r"^opset[0-9]{1,3}$")


def _read_with_openvino(path: Path) -> None:
    try:
        import numpy as np
        import openvino as ov
    except ImportError:
        return  # the standard-library check above is the check
    xml, weights = read_openvino_zip(path)
    try:
        model = ov.Core().read_model(model=xml, weights=ov.Tensor(np.frombuffer(weights, np.uint8)))
    except Exception as exc:
        raise UnsafeArtifactError(f"OpenVINO cannot read the IR: {exc}") from None
    for op in model.get_ordered_ops():
        version = op.get_type_info().version_id
        if not _OPSET.match(version):
            raise UnsafeArtifactError(
                f"operation {op.get_friendly_name()!r:.60} ({op.get_type_name():.40}) is from "
                f"{version!r:.40}, not a standard opset"
            )


def check_runtime_artifact(runtime: str, path: Path) -> dict[str, Any]:
    """{"checked": True} for a data-only artifact, {"checked": False, "reason": ...} where
    this process cannot check it; UnsafeArtifactError for one that is refused."""
    try:
        check_artifact(runtime, path)
    except ArtifactCheckUnavailable as exc:
        return {"checked": False, "reason": str(exc)}
    if runtime == "openvino":
        _read_with_openvino(path)
    return {"checked": True}
