"""Content-addressed files under the data dir: the same bytes are stored once, by sha256.

Everything arrives through a spool file in the store's own tmp folder (same filesystem), so a
finished blob appears with one atomic rename and a failed upload leaves nothing behind.

A spool holds an exclusive `flock` for as long as it lives. The kernel drops that lock when its
process dies, however it dies (kill -9 included), so at start-up every spool nobody holds is
garbage from a dead process and goes, whatever its age, while a spool another live process is
still writing into the same data dir is locked and stays.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import IO

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class TooLarge(Exception):
    """More bytes arrived than the cap allows."""


class Spool:
    """A temp file that hashes and counts what is written and refuses to grow past a cap."""

    def __init__(self, tmp_dir: Path, max_bytes: int, filename: str | None = None) -> None:
        self.max_bytes = max_bytes
        self.filename = filename
        self.size = 0
        self._hash = hashlib.sha256()
        fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="upload-", suffix=".part")
        self.path = Path(name)
        # A second descriptor only for the lock, so closing the data file keeps the claim.
        self._lock_fd: int | None = os.open(name, os.O_RDONLY)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._file: IO[bytes] = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.max_bytes:
            raise TooLarge(f"more than {self.max_bytes} bytes")
        self._hash.update(data)
        self._file.write(data)

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def release(self) -> None:
        """Drop the lock (after the spool was moved into the store or deleted)."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def discard(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.release()


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs"
        self.tmp = root / "tmp"
        self.blobs.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        if not _SHA256.match(sha256):
            raise ValueError(f"not a sha256 digest: {sha256!r}")
        return self.blobs / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def spool(self, max_bytes: int, filename: str | None = None) -> Spool:
        return Spool(self.tmp, max_bytes, filename)

    def put(self, spool: Spool) -> bool:
        """Move a finished spool into place; False when those bytes were already stored."""
        spool.close()
        target = self.path(spool.sha256)
        if target.is_file():
            spool.discard()
            return False
        target.parent.mkdir(exist_ok=True)
        os.replace(spool.path, target)
        spool.release()
        return True

    def remove(self, sha256: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(sha256).unlink()

    def clear_tmp(self) -> int:
        """Remove every spool no live process holds (see the module notes); returns how many."""
        removed = 0
        for leftover in self.tmp.glob("upload-*.part"):
            try:
                fd = os.open(leftover, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live upload of another process sharing this data dir
            else:
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
                    removed += 1
            finally:
                os.close(fd)
        return removed
