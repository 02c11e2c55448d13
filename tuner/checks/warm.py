"""A checking child started before its job: it warms up, says so, runs one job and exits.

Starting a fresh Python that imports torch takes seconds; an upload should not wait for it. So
the service keeps a checking child started ahead (`service.warm_checkers`): in its sandbox,
under its limits, it imports what a check needs and prints `READY` on stdout, then reads one
line from stdin, `{"argv": [...]}` (the check's command line, as `tuner.checks.inspect` takes
it), runs it and exits. One job per process: a check that an upload subverted has no later
check to tamper with. End of input before a job (the service stopping) exits quietly.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TextIO

READY = "ready"


def job_line(argv: list[str]) -> str:
    """What the service writes to a warm child's stdin."""
    return json.dumps({"argv": argv}) + "\n"


def serve_one(
    run: Callable[[list[str]], int],
    warm_up: Callable[[], None],
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
) -> int:
    """`warm_up()`, READY, then `run(argv)` for the one job read from `stdin`; its exit code.

    It leaves with `os._exit`: the answer is already written, and tearing down an interpreter
    that holds torch would add a fraction of a second to every check.
    """
    warm_up()
    stdout.write(READY + "\n")
    stdout.flush()
    line = stdin.readline()
    code = run(list(json.loads(line)["argv"])) if line.strip() else 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
