"""One check in a process of its own, so a segfault or a hang costs one row, not the run.

The child writes its row to a JSON file after every stage (`Row.stage`), atomically; when it
dies, the parent still has what the child got to and in which stage it died, and says so:
"crashed: signal 11 (SIGSEGV) during timing the peers", "timed out after 300 s during tuning".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Row:
    """A check's row, saved to `path` at every stage so a crash leaves the stage it died in."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    def stage(self, what: str, **figures: Any) -> None:
        self.data.update(figures, stage=what)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        os.replace(tmp, self.path)


def read_row(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def signal_status(returncode: int) -> str:
    """ "crashed: signal 11 (SIGSEGV)" for a process killed by a signal (negative return code)."""
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "unknown"
    return f"crashed: signal {number} ({name})"


def child_env() -> dict[str, str]:
    """The caller's environment with the checkout first on PYTHONPATH (the GPU host runs from
    the checkout with wheels on PYTHONPATH, nothing installed)."""
    env = dict(os.environ)
    parts = [str(REPO), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def run_isolated(job: dict[str, Any], work: Path, timeout_s: float) -> dict[str, Any]:
    """Run `bench.gpu_check.child` on `job` in its own session; its row, with the status.

    The row's `status` is the child's own when it exited 0; else what killed it, with the
    stage it was in. On a timeout the whole session (the child and what it started) is killed.
    """
    name = job["name"]
    row_path = work / f"{name}.row.json"
    row_path.unlink(missing_ok=True)
    job = {**job, "row": str(row_path)}
    job_path = work / f"{name}.job.json"
    job_path.write_text(json.dumps(job, indent=2))
    log_path = work / f"{name}.log"
    # faulthandler: a segfault leaves the Python stack it happened under in the log
    cmd = [sys.executable, "-X", "faulthandler", "-m", "bench.gpu_check.child", str(job_path)]
    started = time.monotonic()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            code: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    row = {"name": name, "kind": job["kind"], **read_row(row_path)}
    row["wall_s"] = round(time.monotonic() - started, 1)
    row["log"] = str(log_path)
    during = f" during {row['stage']}" if row.get("stage") not in (None, "done") else ""
    if code is None:
        row["status"] = f"timed out after {timeout_s:.0f} s{during}"
    elif code < 0:
        row["status"] = signal_status(code) + during
    elif code != 0 or "status" not in row:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [""]
        row["status"] = f"failed: exit {code}{during}: {tail[0][:200]}"
    return row
