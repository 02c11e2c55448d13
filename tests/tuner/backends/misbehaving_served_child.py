"""A serving compile child whose jobs misbehave on request: one raises, one hangs, one crashes
(reads address 0, as a converter's native code might), one answers; real process, real signal.

It runs `tuner.backends.child.main(["--serve"])` with the job itself replaced, so the test
pays for no build.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from typing import Any

from tuner.backends import child


def _job(argv: list[str]) -> dict[str, Any]:
    what = argv[0]
    if what == "raise":
        raise ValueError("the converter does not know this operator")
    if what == "hang":
        time.sleep(60)
    if what == "crash":
        ctypes.string_at(0)  # SIGSEGV
    return {"artifact": "done", "compile_s": 0.0, "pid": os.getpid()}


if __name__ == "__main__":
    child.job = _job  # this child process only
    raise SystemExit(child.main(sys.argv[1:]))
