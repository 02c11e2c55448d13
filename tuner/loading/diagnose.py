"""What a file that is not a torch.export program is, and what to do about it.

Users hand fxtune the model files they have: a `torch.save` checkpoint, a TorchScript file, a
text file, a program exported under another torch. Each gets one message, the same from the CLI
and the upload API, that names what the file is and how to make the `.pt2` fxtune reads. It is
decided from the zip's member names, or from the first bytes of a file that is not a zip; nothing
is unpickled and no name from the file is echoed.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from pathlib import Path

import torch

from tuner.contract.errors import ArtifactFormatError, FxtuneError, UnsafeArtifactError

HOW_TO_EXPORT = (
    "export it with torch.export.export(model, args) and torch.export.save(ep, 'model.pt2')"
)
TORCH_SAVE = f"this is a torch.save checkpoint, not a torch.export program: {HOW_TO_EXPORT}"
TORCHSCRIPT = (
    "this is a TorchScript file (torch.jit.save), not a torch.export program: export the "
    "original nn.Module instead with torch.export.export(model, args) and "
    "torch.export.save(ep, 'model.pt2')"
)
TEXT = f"this is a text file, not a torch.export program (a .pt2 zip archive): {HOW_TO_EXPORT}"
EMPTY = f"the file is empty, not a torch.export program: {HOW_TO_EXPORT}"
NOT_A_ZIP = f"this is not a torch.export program (a .pt2 zip archive): {HOW_TO_EXPORT}"
OTHER_ZIP = (
    f"this zip file is not a torch.export program (no archive_format member): {HOW_TO_EXPORT}"
)
HEAD_BYTES = 4096
ZIP_MAGIC = b"PK\x03\x04"  # a zip's first local header
# A pre-1.6 `torch.save` file: pickle protocol 2, then torch's magic number as a pickled long.
_LEGACY_TORCH_SAVE = b"\x80\x02\x8a\x0a" + (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
TORCH_OLD_DEFAULT = "2.4 or older"  # programs from then carry no torch_version
HINTED = (ArtifactFormatError, UnsafeArtifactError)


def missing_file(path: Path) -> ArtifactFormatError:
    if path.is_dir():
        return ArtifactFormatError(
            f"{path} is a folder, not a .pt2 file: pass the file torch.export.save wrote"
        )
    return ArtifactFormatError(f"no such file: {path} (pass the .pt2 file torch.export.save wrote)")


def not_a_zip(path: Path, why: str) -> ArtifactFormatError:
    """For a file zipfile cannot open: what its first bytes say it is (`why`: zipfile's own
    reason, for a zip too damaged to read)."""
    try:
        with path.open("rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        return ArtifactFormatError(f"cannot read the file: {exc.strerror}")
    if not head:
        return ArtifactFormatError(EMPTY)
    if head.startswith(ZIP_MAGIC):
        return ArtifactFormatError(
            f"not a readable .pt2 archive: a damaged or truncated zip ({why})"
        )
    if head.startswith(_LEGACY_TORCH_SAVE):
        return ArtifactFormatError(TORCH_SAVE)
    if _is_text(head):
        return ArtifactFormatError(TEXT)
    return ArtifactFormatError(NOT_A_ZIP)


def _is_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def not_a_program(names: Iterable[str]) -> ArtifactFormatError:
    """For a zip without `archive_format`: a checkpoint or TorchScript file, by member names."""
    below_root = {name.split("/", 1)[1] for name in names if name.count("/") >= 1}
    if "constants.pkl" in below_root and any(rel.startswith("code/") for rel in below_root):
        return ArtifactFormatError(TORCHSCRIPT)
    if "data.pkl" in below_root:
        return ArtifactFormatError(TORCH_SAVE)
    return ArtifactFormatError(OTHER_ZIP)


def this_torch() -> str:
    return torch.__version__


def same_release(exported: str | None) -> bool:
    """Whether `exported` (a program's torch_version) is this torch, local suffixes aside."""
    return exported is not None and exported.split("+")[0] == this_torch().split("+")[0]


def other_torch(exported: str | None, why: str) -> ArtifactFormatError:
    """A program this torch's export format cannot read: it names both versions."""
    here = this_torch()
    return ArtifactFormatError(
        f"this program was exported with torch {exported or TORCH_OLD_DEFAULT}, and fxtune runs "
        f"torch {here}, which cannot load it ({why}): export it again under torch {here}"
    )


def with_torch_hint(exc: FxtuneError, exported: str | None) -> FxtuneError:
    """`exc` with a note naming both versions when the program is from another torch; the
    same error type, so the exit code and HTTP status stay what the failure itself decides."""
    if exported is None or same_release(exported) or type(exc) not in HINTED:
        return exc
    here = this_torch()
    return type(exc)(
        f"{exc} (this program was exported with torch {exported}, and fxtune runs torch "
        f"{here}: export it again under torch {here})"
    )
