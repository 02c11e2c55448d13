"""Files handed between processes: JSON that several read while one rewrites it, and a file
placed into a child's folder without copying it where a link will do."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any


def write_json(path: Path, entries: Any) -> None:
    """`entries` as the whole of `path`, atomically: a reader sees the old file or the new one,
    never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(entries, f)
    os.replace(tmp, path)


def link_or_copy(src: Path, dst: Path) -> None:
    """`dst` as a hard link to `src` (the same file, no copy), else a copy (another file
    system)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
