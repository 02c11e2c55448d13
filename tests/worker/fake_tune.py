"""Stands in for `fxtune tune` in worker tests: same arguments, behaviour from FAKE_TUNE.

ok: progress lines, then a valid result; fail / user_error: stderr and exit 1 / 2; exit_N: a
last stderr line, then exit N;
sleep: progress, then hangs (for timeouts, lost leases and kill -9); needs_warm: exit 1 unless
its temp folder holds the file tests/worker/test_warm_temp.py's warm-up writes (a plain file, not
a link), which it then writes into.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tests.service.fakes import write_result

WARM_FILE = "torchinductor_x/precompiled_headers/h.gch"  # as the warm-up's headers
# Stands in for the worker's warm-up build (`tuner.backends.warm_cache`): writes WARM_FILE under
# its temp folder, then the package path it is given.
WARM_UP = "\n".join(
    [
        "import os, pathlib, sys",
        f"f = pathlib.Path(os.environ['TMPDIR']) / {WARM_FILE!r}",
        "f.parent.mkdir(parents=True)",
        "f.write_text('warm')",
        "pathlib.Path(sys.argv[1]).write_text('package')",
    ]
)


def warm_command() -> list[str]:
    return [sys.executable, "-c", WARM_UP]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("--device")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--budget-s", type=float)
    parser.add_argument("--progress-json", action="store_true")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--cache-out", type=Path)
    parser.add_argument("--no-sandbox", action="store_true")
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    mode = os.environ.get("FAKE_TUNE", "ok")
    for i in range(3):
        print(json.dumps({"progress": i / 4, "message": f"step {i}"}), flush=True)
        time.sleep(float(os.environ.get("FAKE_TUNE_STEP_S", "0.1")))
    if mode == "fail":
        sys.stderr.write("Traceback (most recent call last):\n  ...\nRuntimeError: it broke\n")
        sys.exit(1)
    if mode == "user_error":
        sys.stderr.write("warning: noise\nerror: refused to load an archive member: nope\n")
        sys.exit(2)
    if mode.startswith("exit_"):
        sys.stderr.write(f"error: exiting {mode}\n")
        sys.exit(int(mode.removeprefix("exit_")))
    if mode == "needs_warm":
        warm = Path(os.environ["TMPDIR"]) / WARM_FILE
        if not warm.is_file() or warm.is_symlink() or warm.read_text() != "warm":
            sys.stderr.write(f"error: no warm file at {warm}\n")
            sys.exit(1)
        warm.write_text("written by a job")
    if mode == "sleep":
        print(json.dumps({"progress": 0.5, "message": "sleeping"}), flush=True)
        time.sleep(3600)
    write_result(args.report.parent, args.model)
    print(json.dumps({"progress": 1.0, "message": "done"}), flush=True)


if __name__ == "__main__":
    main()
