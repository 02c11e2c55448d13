"""Stands in for `fxtune tune` in worker tests: same arguments, behaviour from FAKE_TUNE.

ok: progress lines, then a valid result; fail / user_error: stderr and exit 1 / 2; exit_N: a
last stderr line, then exit N;
sleep: progress, then hangs (for timeouts, lost leases and kill -9).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tests.service.fakes import write_result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("--device")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--budget-s", type=float)
    parser.add_argument("--progress-json", action="store_true")
    parser.add_argument("--cache", type=Path)
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
    if mode == "sleep":
        print(json.dumps({"progress": 0.5, "message": "sleeping"}), flush=True)
        time.sleep(3600)
    write_result(args.report.parent, args.model)
    print(json.dumps({"progress": 1.0, "message": "done"}), flush=True)


if __name__ == "__main__":
    main()
