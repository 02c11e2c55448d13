"""Damaged `.pt2` zips whose directory looks fine but whose program member cannot be read.

Each variant breaks `models/model.json` in one way that zipfile only notices while reading it:
a wrong CRC, a broken deflate stream, the encrypted flag, a local header that names another
member than the central directory, a declared size larger than the data. `RAW_ERROR` is what
plain zipfile raises for each (the control: the file really is damaged that way).
"""

from __future__ import annotations

import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

PROGRAM_JSON = "models/model.json"
LOCAL = struct.Struct("<4s2B4HL2L2H")
CENTRAL = struct.Struct("<4s4B4HL2L5H2L")


def _relayout(src: Path, dst: Path, compression: int) -> tuple[zipfile.ZipInfo, int]:
    """Copy `src` with the program JSON stored under `compression`; returns its entry and the
    offset of its data in `dst`."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith(f"/{PROGRAM_JSON}"):
                item.compress_type = compression
            zout.writestr(item, data, compress_type=item.compress_type)
    with zipfile.ZipFile(dst) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(f"/{PROGRAM_JSON}"))
    raw = dst.read_bytes()
    fields = LOCAL.unpack_from(raw, info.header_offset)
    return info, info.header_offset + LOCAL.size + fields[10] + fields[11]


def _central_offset(raw: bytes, name: str) -> int:
    at = raw.find(b"PK\x01\x02")
    while at != -1:
        fields = CENTRAL.unpack_from(raw, at)
        if raw[at + CENTRAL.size : at + CENTRAL.size + fields[12]] == name.encode():
            return at
        at = raw.find(b"PK\x01\x02", at + 4)
    raise AssertionError(f"{name} is not in the central directory")


def _patch(dst: Path, at: int, data: bytes) -> None:
    raw = bytearray(dst.read_bytes())
    raw[at : at + len(data)] = data
    dst.write_bytes(bytes(raw))


def bad_crc(src: Path, dst: Path) -> Path:
    """One byte of the stored JSON changed, its CRC not."""
    info, data_at = _relayout(src, dst, zipfile.ZIP_STORED)
    middle = data_at + info.file_size // 2
    old = dst.read_bytes()[middle]
    _patch(dst, middle, bytes([old ^ 0x01]))
    return dst


def bad_deflate(src: Path, dst: Path) -> Path:
    """The deflate stream starts with a block of the reserved type 3."""
    _, data_at = _relayout(src, dst, zipfile.ZIP_DEFLATED)
    _patch(dst, data_at, b"\x07")
    return dst


def encrypted(src: Path, dst: Path) -> Path:
    """The encrypted flag set on the JSON, in its local header and in the directory."""
    info, _ = _relayout(src, dst, zipfile.ZIP_STORED)
    raw = dst.read_bytes()
    local_flags = LOCAL.unpack_from(raw, info.header_offset)[3]
    _patch(dst, info.header_offset + 6, struct.pack("<H", local_flags | 0x1))
    central = _central_offset(raw, info.filename)
    central_flags = CENTRAL.unpack_from(raw, central)[5]
    _patch(dst, central + 8, struct.pack("<H", central_flags | 0x1))
    return dst


def renamed_locally(src: Path, dst: Path) -> Path:
    """The local header names `models/modeX.json`; the directory still says model.json."""
    info, _ = _relayout(src, dst, zipfile.ZIP_STORED)
    name_at = info.header_offset + LOCAL.size
    _patch(dst, name_at, info.filename.replace("model.json", "modeX.json").encode())
    return dst


def oversized(src: Path, dst: Path, extra: int = 1024 * 1024) -> Path:
    """The directory declares 64 MiB more JSON than the file holds (stored: same both sizes)."""
    info, _ = _relayout(src, dst, zipfile.ZIP_STORED)
    raw = dst.read_bytes()
    central = _central_offset(raw, info.filename)
    size = info.file_size + extra
    _patch(dst, central + 20, struct.pack("<LL", size, size))
    return dst


VARIANTS: dict[str, Callable[[Path, Path], Path]] = {
    "bad_crc": bad_crc,
    "bad_deflate": bad_deflate,
    "encrypted": encrypted,
    "renamed_locally": renamed_locally,
    "oversized": oversized,
}
RAW_ERROR: dict[str, type[BaseException] | tuple[type[BaseException], ...]] = {
    "bad_crc": zipfile.BadZipFile,
    "bad_deflate": zlib.error,
    "encrypted": RuntimeError,
    "renamed_locally": zipfile.BadZipFile,
    "oversized": (EOFError, zipfile.BadZipFile),
}


def read_program_json(path: Path) -> bytes:
    """What plain zipfile does with the member (raises for every variant)."""
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(f"/{PROGRAM_JSON}"))
        return zf.read(name)
