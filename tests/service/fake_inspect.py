"""A checking child that misbehaves on request, spoken to as `tuner.checks.inspect` is.

`python -m tests.service.fake_inspect fingerprint PROGRAM --out R.json` (cold) or `... warm`
(the real `tuner.checks.warm` protocol). The program file's text says what to do: `sleep`
(overrun every limit), `crash` (SIGSEGV), `refuse` (exit 3 with an `error:` line), `edit` (try
to write to the file it checks), `huge` (an answer of 8 MiB), anything else: answer with a
fingerprint naming the text and this process's id, as the child sees it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tuner.checks.warm import serve_one


def run(argv: list[str]) -> int:
    command, program, _, out = argv
    assert command == "fingerprint", argv
    what = Path(program).read_text()
    if what == "sleep":
        time.sleep(3600)
    elif what == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif what == "refuse":
        print("error: refused: the fake says no", file=sys.stderr)
        return 3
    elif what == "huge":
        Path(out).write_text(json.dumps({"fingerprint": "x" * (8 << 20)}))
        return 0
    elif what == "edit":
        try:
            Path(program).write_text("edited")
            what = "edited"
        except OSError as exc:
            what = f"cannot edit: {exc.strerror}"
    Path(out).write_text(json.dumps({"fingerprint": what, "pid": os.getpid()}))
    return 0


def main(argv: list[str]) -> int:
    if argv == ["warm"]:
        return serve_one(run, lambda: None)
    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
