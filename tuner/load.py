"""Loading uploaded `.pt2` archives without ever running pickled code from them.

`torch.export.load` unpickles some archive members with `weights_only=False` (pickled weights and
constants, and as a silent fallback for sample inputs) and others with plain `pickle.loads`
(custom objects). A crafted archive therefore runs arbitrary code. Here every such call is forced
through the restricted `weights_only=True` unpickler; anything that needs more is refused.
"""

from __future__ import annotations

import contextlib
import functools
import io
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.pt2_archive import _package as pt2_package

from tuner.errors import ArtifactFormatError, UnsafeArtifactError

_REFUSAL = (
    "refused to load {what}: it needs full pickle, which can run arbitrary code "
    "({reason}). Re-export the model with torch.export.save from plain tensors."
)


class _NoPickle:
    """Stands in for the `pickle` module inside torch's archive reader."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        if name in {"load", "loads", "Unpickler"}:
            raise UnsafeArtifactError(_REFUSAL.format(what="a custom object", reason=name))
        return getattr(self._real, name)


@contextlib.contextmanager
def _restricted_unpickling() -> Iterator[None]:
    real_load = torch.load
    real_pickle = pt2_package.pickle

    @functools.wraps(real_load)
    def safe_load(f: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        try:
            return real_load(f, *args, **kwargs)
        except Exception as exc:  # the restricted unpickler says why in its message
            raise UnsafeArtifactError(
                _REFUSAL.format(what="an archive member", reason=str(exc).splitlines()[0])
            ) from None

    torch.load = safe_load
    pt2_package.pickle = _NoPickle(real_pickle)
    try:
        yield
    finally:
        torch.load = real_load
        pt2_package.pickle = real_pickle


def check_archive(data: bytes | Path | str) -> list[str]:
    """Cheap format check from content: a zip holding a torch.export model. Returns member names."""
    source: Any = io.BytesIO(data) if isinstance(data, bytes) else data
    try:
        with zipfile.ZipFile(source) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArtifactFormatError(f"not a .pt2 archive (zip): {exc}") from None
    if len(set(names)) != len(names):
        raise ArtifactFormatError("archive has duplicate member names")
    if not any(n.endswith("/archive_format") for n in names):
        raise ArtifactFormatError("zip file is not a torch.export .pt2 archive (no archive_format)")
    if not any(n.endswith("models/model.json") for n in names):
        raise ArtifactFormatError("archive holds no exported program (models/model.json missing)")
    return names


def load_program(path: Path | str) -> ExportedProgram:
    """Load a `.pt2` written by `torch.export.save`, refusing anything that needs full pickle."""
    path = Path(path)
    if not path.is_file():
        raise ArtifactFormatError(f"no such file: {path}")
    check_archive(path)
    with _restricted_unpickling():
        try:
            program = torch.export.load(path)
        except UnsafeArtifactError:
            raise
        except Exception as exc:
            raise ArtifactFormatError(f"could not load {path.name}: {exc}") from exc
    if not isinstance(program, ExportedProgram):
        raise ArtifactFormatError(f"{path.name} holds no ExportedProgram")
    return program
