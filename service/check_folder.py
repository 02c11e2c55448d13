"""The folder one check of an untrusted program works in, under the service's data folder.

The checking child sees this folder and nothing else of the data folder: its files to check are
hard-linked (else copied) into `in/`, which the sandbox binds read-only (a hard link is the
spooled upload itself: a subverted check must not edit what the service then stores); the rest,
where it writes its answer, its stderr and its temporary files, is writable. A warm checker's
folder exists before its upload does; that is why the files arrive by link into a folder the
child already sees.

While its owner lives, a folder is locked (`flock` on a sibling `.lock` file the child cannot
reach), so a service that starts removes only what a killed process left, never the folders of
another live service sharing the data folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from tuner.host.files import link_or_copy

INPUTS = "in"


class CheckFolder:
    """`root/<prefix>XXXX/` with an empty `in/`, locked until `remove`."""

    def __init__(self, root: Path, prefix: str) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self._lock, lock_path = tempfile.mkstemp(prefix=prefix, suffix=".lock", dir=root)
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # before the folder exists: never a live leftover
        self._lock_path = Path(lock_path)
        self.path = self._lock_path.with_suffix("")
        self.path.mkdir(mode=0o700)
        self.inputs.mkdir()

    @property
    def inputs(self) -> Path:
        return self.path / INPUTS

    def place(self, files: dict[str, Path]) -> dict[str, str]:
        """Put `files` (name: source) into `in/`; their paths as the child names them."""
        for name, src in files.items():
            link_or_copy(src, self.inputs / name)
        return {name: f"{INPUTS}/{name}" for name in files}

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            self._lock_path.unlink()
        os.close(self._lock)

    @staticmethod
    def clear_leftovers(root: Path) -> int:
        """Remove the check folders under `root` whose owner is gone; returns how many."""
        removed = 0
        for lock_path in root.glob("*.lock") if root.is_dir() else ():
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live check of another process sharing this data folder
            else:
                shutil.rmtree(lock_path.with_suffix(""), ignore_errors=True)
                with contextlib.suppress(FileNotFoundError):
                    lock_path.unlink()
                removed += 1
            finally:
                os.close(fd)
        return removed
