"""Run a child process with limits, relaying its progress lines.

Used for the worker's tuning child and the service's checks of uploaded programs.

The child gets an address-space and CPU-time cap (setrlimit), its own process group (so a
timeout kills everything it started), and dies with the worker (PR_SET_PDEATHSIG): a worker
killed with -9 leaves no orphan tuning behind, and the lease brings the job back. Its temporary
files (TMPDIR, Inductor's and Triton's caches) live in the job's folder, so they go with it.
Where bubblewrap is installed the child also runs in its own namespaces: a read-only view of the
system, a private /tmp, no network, and only the job folder and the decision cache writable.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger("fxtune.worker")

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class Limits:
    wall_s: float
    cpu_s: int | None = None
    address_space_bytes: int | None = None


SandboxMode = Literal["auto", "bwrap", "none"]


class SandboxUnavailable(RuntimeError):
    """bubblewrap was required but cannot run here."""


@dataclass(frozen=True)
class Sandbox:
    """Namespaces around the child: `bwrap`, or `none` (rlimits and a private TMPDIR only)."""

    kind: Literal["bwrap", "none"] = "none"
    writable: tuple[Path, ...] = ()
    share_devices: bool = False  # GPUs need the host's /dev

    def wrap(self, cmd: list[str], workdir: Path) -> list[str]:
        if self.kind == "none":
            return cmd
        dev = ["--dev-bind", "/dev", "/dev"] if self.share_devices else ["--dev", "/dev"]
        binds: list[str] = []
        for path in (workdir, *self.writable):
            binds += ["--bind", str(path), str(path)]
        return [
            "bwrap",
            "--ro-bind", "/", "/",
            *dev,
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            *binds,
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--chdir", str(workdir),
            "--",
            *cmd,
        ]  # fmt: skip


@functools.cache
def bwrap_works() -> bool:
    """Whether bubblewrap is installed and may create namespaces here (containers may forbid)."""
    if shutil.which("bwrap") is None:
        return False
    probe = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--unshare-all", "--", "true"]
    try:
        return subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def choose_sandbox(
    mode: SandboxMode, writable: tuple[Path, ...] = (), share_devices: bool = False
) -> Sandbox:
    """`auto` takes bubblewrap where it works and says so once where it does not."""
    if mode == "none":
        return Sandbox("none")
    if bwrap_works():
        return Sandbox("bwrap", writable, share_devices)
    if mode == "bwrap":
        raise SandboxUnavailable("FXTUNE_WORKER_SANDBOX=bwrap, but bubblewrap cannot run here")
    _warn_no_bwrap()
    return Sandbox("none")


@functools.cache
def _warn_no_bwrap() -> None:
    log.warning(
        "bubblewrap is not available: tuning children run with resource limits and a private "
        "TMPDIR, but see the whole file system and the network (install Debian's bubblewrap)"
    )


def private_temp_env(workdir: Path) -> dict[str, str]:
    """Point every temporary and cache folder the tuner's stack uses into the job's folder."""
    tmp = workdir / "tmp"
    tmp.mkdir(exist_ok=True)
    return {
        "TMPDIR": str(tmp),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
        "TRITON_CACHE_DIR": str(tmp / "triton"),
    }


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    error: str | None
    timed_out: bool = False
    cancelled: bool = False

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not (self.timed_out or self.cancelled)


def physical_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _apply_limits(limits: Limits) -> Callable[[], None]:
    """Runs in the child between fork and exec: only async-signal-safe-ish calls here."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limits.address_space_bytes:
            cap = limits.address_space_bytes
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        if limits.cpu_s:
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        if _libc is not None:
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return apply


def error_line(stderr_text: str) -> str | None:
    """The message to show for a failed run: the CLI's `error:` block, else the last line."""
    lines = [ln.strip() for ln in stderr_text.splitlines() if ln.strip()]
    if not lines:
        return None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].lower().startswith("error:"):
            return " ".join(lines[i:])[:4000]
    return lines[-1][:4000]


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exited with status {code}"
    name = signal.Signals(-code).name
    hints = {"SIGXCPU": " (CPU-time limit)", "SIGKILL": " (killed: out of memory?)"}
    return f"killed by {name}{hints.get(name, '')}"


def _relay(stream: object, on_progress: Progress) -> None:
    for raw in stream:  # type: ignore[attr-defined]
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            event = json.loads(raw)
            on_progress(float(event["progress"]), str(event.get("message", "")))


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_child(
    cmd: list[str],
    limits: Limits,
    workdir: Path,
    on_progress: Progress,
    cancelled: Callable[[], bool] = lambda: False,
    on_started: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    sandbox: Sandbox = Sandbox(),
) -> ChildResult:
    """Run `cmd`; stdout carries JSON progress lines, stderr goes to a file for the error.

    Start other threads in `on_started`, not before: `preexec_fn` is only safe to fork from a
    process that runs no other thread.
    """
    stderr_path = workdir / "stderr.log"
    child_env = {
        **os.environ,
        **private_temp_env(workdir),
        **(env or {}),
        "PYTHONUNBUFFERED": "1",
    }
    with stderr_path.open("w") as stderr:
        try:
            proc = subprocess.Popen(
                sandbox.wrap(cmd, workdir),
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=child_env,
                start_new_session=True,
                preexec_fn=_apply_limits(limits),
            )
        except OSError as exc:
            return ChildResult(127, f"cannot start the tuner ({cmd[0]}): {exc}")
        reader = threading.Thread(target=_relay, args=(proc.stdout, on_progress), daemon=True)
        reader.start()
        if on_started is not None:
            on_started()
        timed_out = was_cancelled = False
        deadline = time.monotonic() + limits.wall_s
        while proc.poll() is None:
            if time.monotonic() > deadline:
                timed_out = True
            elif cancelled():
                was_cancelled = True
            if timed_out or was_cancelled:
                _kill_group(proc)
                proc.wait()
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)
        _kill_group(proc)  # anything the child left running in its group
        reader.join(timeout=5)
    code = proc.returncode
    if code == 0 and not (timed_out or was_cancelled):
        return ChildResult(0, None)
    if timed_out:
        error = f"tuning timed out after {limits.wall_s:g}s and was killed"
    elif was_cancelled:
        error = "tuning was cancelled"
    else:
        detail = error_line(stderr_path.read_text(errors="replace")[-64_000:])
        error = detail if detail and code > 0 else f"tuner {_describe_exit(code)}"
        if detail and code < 0:
            error = f"tuner {_describe_exit(code)}: {detail}"
    return ChildResult(code, error, timed_out, was_cancelled)
