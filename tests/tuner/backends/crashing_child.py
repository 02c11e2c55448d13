"""A compile child that segfaults when it runs what it built: a real crash in a real child.

It goes through tuner.backends.child.main with the compile skipped (to keep the test short)
and the package's runner, or the probed backend's, replaced by one that reads address 0, as a
miscompiled kernel would.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path
from typing import Any

from tuner.backends import child
from tuner.backends import registry as backends


def _no_compile(program: Any, path: Path, **_: Any) -> Path:
    return path


def _load_crashing(path: Path) -> Any:
    def run(*args: Any) -> None:
        ctypes.string_at(0)  # SIGSEGV

    return run


def _build_crashing(*_: Any) -> backends.Built:
    return backends.Built(_load_crashing(Path()))


if __name__ == "__main__":
    backends.package_aoti = _no_compile  # this child process only
    backends.load_aoti = _load_crashing
    for name in backends.PROBED:
        backends.BACKENDS[name] = _build_crashing
    raise SystemExit(child.main(sys.argv[1:]))
