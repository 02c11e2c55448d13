"""Reading an untrusted `.pt2` zip: an allowlist of members, size caps, bounded reads.

Everything here is decided from the zip's central directory before a byte of content is
inflated: which members exist (only what `torch.export.save` writes for one program; never
AOTInductor libraries, extra files or unknown folders), how large each claims to be, and how much
it claims to inflate. Reads then stop at the declared size, so a member that lies about its size
cannot grow past the caps either.
"""

from __future__ import annotations

import re
import stat
import struct
import sys
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tuner.contract.errors import ArtifactFormatError, UnsafeArtifactError
from tuner.loading import diagnose

GiB = 1024**3
MiB = 1024**2

# Member paths below the archive's root folder, as torch.export.save writes them for "model".
_FIXED_MEMBERS = frozenset(
    {
        "archive_format",
        "archive_version",
        "byteorder",
        ".data/version",
        ".data/serialization_id",
        "models/model.json",
        "data/weights/model_weights_config.json",
        "data/constants/model_constants_config.json",
        "data/sample_inputs/model.pt",
    }
)
_PAYLOAD = re.compile(r"data/(weights/weight|constants/tensor)_\d{1,9}")
_WHY_REFUSED = {
    "data/aotinductor/": "AOTInductor members carry native libraries that loading would run",
    "data/mtia/": "device binaries are not accepted",
    "data/executorch/": "ExecuTorch payloads are not accepted",
    "extra/": "extra files are not part of a program",
    "data/weights/model.pt": "legacy pickled weights need full pickle",
    "data/constants/model.pt": "legacy pickled constants need full pickle",
    "data/constants/custom_obj": "custom (torchbind) objects are native code",
    "data/constants/opaque_obj": "opaque objects need full pickle",
}
_ALLOWED_COMPRESSION = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)
_ENCRYPTED = 0x1  # general purpose flag bit 0
_UTF8_NAME = 0x800  # general purpose flag bit 11
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # zipfile's own layout of a local file header
# What zipfile, zlib and the stream reader raise on a damaged member: a wrong CRC, a broken
# deflate stream, an encrypted member, a header that disagrees with the directory, data that
# ends before the declared size.
_READ_ERRORS = (
    zipfile.BadZipFile,
    zlib.error,
    RuntimeError,
    EOFError,
    OSError,
    ValueError,
    NotImplementedError,
)


@dataclass(frozen=True)
class ArchiveLimits:
    """Caps checked from the zip directory; the defaults admit any real model up to 64 GiB."""

    max_members: int = 20_000
    max_member_bytes: int = 64 * GiB
    max_total_bytes: int = 64 * GiB
    max_json_bytes: int = 64 * MiB  # BERT-large's program JSON is a few MiB
    max_ratio: float = 40.0  # inflated / compressed; weights barely compress, bombs do
    ratio_exempt_bytes: int = 4 * MiB  # small JSON members may compress well


@dataclass(frozen=True)
class ProgramArchive:
    """A `.pt2` whose directory passed every check; `read` returns a member's bytes."""

    path: Path
    root: str
    members: dict[str, zipfile.ZipInfo]  # relative path -> entry
    limits: ArchiveLimits
    _open: list[zipfile.ZipFile] = field(default_factory=list, compare=False, repr=False)

    @contextmanager
    def kept_open(self) -> Iterator[None]:
        """Reads inside the block share one open zip. Opened per read, zipfile parses the whole
        central directory each time: efficientnet_b0's 360 tensors took 2.6 s of its load."""
        try:
            zf = zipfile.ZipFile(self.path)
        except _READ_ERRORS as exc:
            raise ArtifactFormatError(f"not a readable .pt2 archive: {_short(exc)}") from None
        self._open.append(zf)
        try:
            yield
        finally:
            self._open.remove(zf)
            zf.close()

    def has(self, rel: str) -> bool:
        return rel in self.members

    def size(self, rel: str) -> int:
        return self.members[rel].file_size

    def read(self, rel: str, cap: int | None = None) -> bytes:
        info = self.members.get(rel)
        if info is None:
            raise ArtifactFormatError(f"archive member {rel} is missing")
        if cap is not None and info.file_size > cap:
            raise UnsafeArtifactError(
                f"archive member {rel} declares {_fmt(info.file_size)}, over its cap of {_fmt(cap)}"
            )
        try:
            if self._open:
                with self._open[-1].open(info) as stream:
                    data = stream.read(info.file_size + 1)  # zipfile stops at the declared size
            else:
                with zipfile.ZipFile(self.path) as zf, zf.open(info) as stream:
                    data = stream.read(info.file_size + 1)
        except _READ_ERRORS as exc:
            raise ArtifactFormatError(f"archive member {rel} is damaged: {_short(exc)}") from None
        if len(data) != info.file_size:
            raise ArtifactFormatError(f"archive member {rel} is truncated or mis-sized")
        return data

    def read_text(self, rel: str, cap: int | None = None) -> str:
        try:
            return self.read(rel, cap).decode()
        except UnicodeDecodeError:
            raise ArtifactFormatError(f"archive member {rel} is not UTF-8 text") from None


def _short(exc: BaseException) -> str:
    """The error's type and message, bounded: names in it come from the untrusted archive."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:300] + "..."


def _fmt(n: int) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / MiB:.1f} MiB"


def _why_refused(rel: str) -> str:
    for prefix, why in _WHY_REFUSED.items():
        if rel.startswith(prefix):
            return why
    return "it is not part of a torch.export program"


def _check_name(name: str) -> tuple[str, str]:
    """Split a member name into (root, relative path), refusing anything path-like or odd."""
    if not name or "\\" in name or "\0" in name or name.startswith("/"):
        raise UnsafeArtifactError(f"refused archive member name {name!r}")
    parts = PurePosixPath(name).parts
    if any(p in ("..", ".") for p in name.split("/")) or len(parts) < 2 or name.endswith("/"):
        raise UnsafeArtifactError(f"refused archive member name {name!r}")
    return parts[0], "/".join(parts[1:])


def _check_entry(info: zipfile.ZipInfo, rel: str, limits: ArchiveLimits) -> None:
    if rel not in _FIXED_MEMBERS and not _PAYLOAD.fullmatch(rel):
        raise UnsafeArtifactError(f"refused archive member {info.filename}: {_why_refused(rel)}")
    if info.flag_bits & _ENCRYPTED:
        raise ArtifactFormatError(f"refused archive member {info.filename}: it is encrypted")
    if info.compress_type not in _ALLOWED_COMPRESSION:
        raise UnsafeArtifactError(f"refused archive member {info.filename}: unusual compression")
    if stat.S_ISLNK(info.external_attr >> 16):
        raise UnsafeArtifactError(f"refused archive member {info.filename}: a symbolic link")
    if info.file_size > limits.max_member_bytes:
        raise UnsafeArtifactError(
            f"refused archive member {info.filename}: it declares {_fmt(info.file_size)}, "
            f"over the {_fmt(limits.max_member_bytes)} member cap"
        )
    if info.file_size > limits.ratio_exempt_bytes:
        ratio = info.file_size / max(info.compress_size, 1)
        if ratio > limits.max_ratio:
            raise UnsafeArtifactError(
                f"refused archive member {info.filename}: it inflates {ratio:.0f}x "
                f"({_fmt(info.compress_size)} to {_fmt(info.file_size)}; cap {limits.max_ratio:g}x)"
                " - a zip bomb, not model weights"
            )


def _check_local_headers(path: Path, infos: list[zipfile.ZipInfo]) -> None:
    """Each member's local header must name it as the central directory does, and agree that it
    is not encrypted: tools that read the local headers (streaming unzippers) would otherwise
    see other members than the ones checked here."""
    with path.open("rb") as f:
        for info in infos:
            f.seek(info.header_offset)
            raw = f.read(_LOCAL_HEADER.size)
            if len(raw) != _LOCAL_HEADER.size or raw[:4] != b"PK\x03\x04":
                raise ArtifactFormatError(
                    f"archive member {info.filename} has no local header where the directory "
                    "says (a damaged or truncated zip)"
                )
            fields = _LOCAL_HEADER.unpack(raw)
            flags, name_len = fields[3], fields[10]
            name = f.read(name_len)
            expected = info.orig_filename.encode(
                "utf-8" if info.flag_bits & _UTF8_NAME else "cp437", "replace"
            )
            if name != expected:
                raise UnsafeArtifactError(
                    f"refused archive member {info.filename}: its local header names it "
                    f"{name[:100].decode('utf-8', 'replace')!r} (tools would disagree on what "
                    "the archive holds)"
                )
            if flags & _ENCRYPTED:
                raise ArtifactFormatError(
                    f"refused archive member {info.filename}: it is encrypted"
                )


def open_archive(path: Path | str, limits: ArchiveLimits | None = None) -> ProgramArchive:
    """Check a `.pt2`'s zip directory against the allowlist and caps; nothing is inflated."""
    limits = limits or ArchiveLimits()
    path = Path(path)
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
    except FileNotFoundError:
        raise diagnose.missing_file(path) from None
    except zipfile.BadZipFile as exc:
        raise diagnose.not_a_zip(path, _short(exc)) from None
    except (OSError, ValueError, NotImplementedError) as exc:
        raise ArtifactFormatError(f"not a .pt2 archive (zip): {_short(exc)}") from None
    names = [i.filename for i in infos]
    if not any(n.count("/") == 1 and n.endswith("/archive_format") for n in names):
        raise diagnose.not_a_program(names)
    if len(infos) > limits.max_members:
        raise UnsafeArtifactError(
            f"refused: the archive has {len(infos)} members (cap {limits.max_members})"
        )
    roots: set[str] = set()
    members: dict[str, zipfile.ZipInfo] = {}
    total = 0
    for info in infos:
        root, rel = _check_name(info.filename)
        roots.add(root)
        if rel in members:
            raise ArtifactFormatError(f"archive has duplicate member {info.filename}")
        _check_entry(info, rel, limits)
        members[rel] = info
        total += info.file_size
    try:
        _check_local_headers(path, infos)
    except OSError as exc:
        raise ArtifactFormatError(f"not a readable .pt2 archive: {_short(exc)}") from None
    if len(roots) > 1:
        raise UnsafeArtifactError(f"refused: the archive has several root folders {sorted(roots)}")
    if total > limits.max_total_bytes:
        raise UnsafeArtifactError(
            f"refused: the archive inflates to {_fmt(total)}, over the "
            f"{_fmt(limits.max_total_bytes)} cap"
        )
    if "models/model.json" not in members:
        raise ArtifactFormatError("archive holds no exported program (models/model.json missing)")
    archive = ProgramArchive(path, roots.pop(), members, limits)
    byteorder = archive.read_text("byteorder", 16) if archive.has("byteorder") else sys.byteorder
    if byteorder.strip() != sys.byteorder:
        raise ArtifactFormatError(f"archive was written {byteorder} endian; this machine is not")
    return archive
