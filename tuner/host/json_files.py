"""JSON files that several processes read while one rewrites them."""

from __future__ import annotations

import json
import os
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
