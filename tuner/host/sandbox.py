"""Run a child process with limits, relaying its progress lines.

Used for the worker's tuning child and the service's checks of uploaded programs.

The child gets an address-space and CPU-time cap (setrlimit), its own process group (so a
timeout kills everything it started), and dies with the worker (PR_SET_PDEATHSIG): a worker
killed with -9 leaves no orphan tuning behind, and the lease brings the job back. Its temporary
files (TMPDIR, Inductor's and Triton's caches) live in the job's folder, so they go with it.
Its environment is built from an allowlist (`tuner.host.child_env`), never the parent's secrets.
PR_SET_PDEATHSIG fires when the *thread* that started the child ends, so a child that outlives
the call starting it (the service's warm checkers) must come from a thread that lives as long.

Under bubblewrap the child runs in its own namespaces (no network, its own processes) on a root
that holds only what it needs: the system's programs and libraries (/usr and its links, the
/etc files the loader and Python read), the Python environment and fxtune's code, read-only; the
job folder, writable (but for `read_only` folders in it: the files a check reads, the copy of the
shared caches a job reads); a private /tmp and /dev/shm, memory-backed and capped
(`MEMORY_FOLDER_BYTES`), in a /dev of its own that is otherwise read-only. Not `/`: the home
folder, the service's data folder (database, uploads), the shared caches and other jobs' folders
are simply not there.
Without bubblewrap nothing of this holds, so a worker refuses to run unless the operator chose
`none` explicitly (`resolve_sandbox`).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import importlib.util
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tuner.host.child_env import (
    MAX_ERROR_CHARS,
    MAX_PROGRESS_CHARS,
    REDACTED,
    child_environment,
)

log = logging.getLogger("fxtune.worker")

PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None

Progress = Callable[[float, str], None]
Redact = Callable[[str, int], str]  # (text, length cap) -> text safe to relay


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Limits:
    wall_s: float
    cpu_s: int | None = None
    address_space_bytes: int | None = None

    def within(self, sandbox: Sandbox) -> Limits:
        """These limits with the sandbox's memory-backed folders taken off the memory cap."""
        if self.address_space_bytes is None or not sandbox.memory_bytes:
            return self
        cap = max(self.address_space_bytes - sandbox.memory_bytes, sandbox.memory_bytes)
        return dataclasses.replace(self, address_space_bytes=cap)


SandboxMode = Literal["auto", "bwrap", "none"]
SandboxKind = Literal["bwrap", "none"]

# The system, read-only: programs and libraries, and the /etc files the dynamic loader, Python
# and torch read (users for getpass, hosts for the ranks' loopback, the time zone).
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/alternatives",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/hosts",
    "/etc/os-release",
)
# What torch reads of /sys for CPU topology; a GPU job gets /sys whole (the driver needs it).
CPU_SYS = ("/sys/devices/system/cpu", "/sys/devices/system/node")

NO_BWRAP = (
    "bubblewrap cannot run here (it is not installed, or this machine forbids the namespaces it "
    "needs, as Docker's default seccomp profile does), and tuning untrusted programs without it "
    "exposes this machine: install Debian's `bubblewrap` (apt-get install bubblewrap), or set "
    "FXTUNE_WORKER_SANDBOX=none to tune with resource limits only (the child then sees the whole "
    "file system and the network)"
)


class SandboxUnavailable(RuntimeError):
    """bubblewrap was required (`auto` or `bwrap`) but cannot run here."""


def python_paths() -> list[Path]:
    """Where the child's Python and its packages come from: the environment's prefixes (the venv
    and the interpreter's install), the import path's folders (a `.pth` file may add one from
    elsewhere) and the real folders of torch and fxtune (which may be reached through symbolic
    links). Not `sys.path[0]`: that is the folder the process was started from. torch is
    found, not imported: a worker that imported it here paid seconds before its first job's
    first heartbeat."""
    found = [Path(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)]
    found += [Path(p) for p in sys.path[1:] if p]
    for package in ("torch", "tuner"):
        spec = importlib.util.find_spec(package)
        if spec is not None and spec.origin is not None:
            found.append(Path(spec.origin).resolve().parent.parent)
    return found


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """Existing absolute paths, resolved, without those inside another one (or inside /usr)."""
    real = sorted({p.resolve() for p in paths if p.is_absolute() and p.exists()})
    kept: list[Path] = []
    for path in real:
        if path.is_relative_to("/usr") or any(path.is_relative_to(k) for k in kept):
            continue
        kept.append(path)
    return kept


# Each memory-backed folder of the sandbox (/tmp, /dev/shm) holds at most this: its pages are
# memory that no address-space limit counts, so a job's cap is lowered by both (`memory_bytes`).
# The tuner's own temporary files go to the job folder on disk (`child_env.private_temp_env`).
MEMORY_FOLDER_BYTES = 64 * 1024**2


@dataclass(frozen=True)
class Sandbox:
    """Namespaces around the child: `bwrap`, or `none` (rlimits and a private TMPDIR only)."""

    kind: SandboxKind = "none"
    writable: tuple[Path, ...] = ()
    share_devices: bool = False  # GPUs need the host's /dev and /sys
    read_only: tuple[Path, ...] = ()  # inside a writable folder: what the child reads, not edits
    memory_folder_bytes: int = MEMORY_FOLDER_BYTES

    @property
    def memory_bytes(self) -> int:
        """What the child can hold in memory-backed folders (under bubblewrap): a job's
        memory cap counts it (`Limits.within`)."""
        return 2 * self.memory_folder_bytes if self.kind == "bwrap" else 0

    def wrap(self, cmd: list[str], workdir: Path, python_path: str | None = None) -> list[str]:
        """`cmd` under bubblewrap; `python_path` (the child's PYTHONPATH) and the folder of the
        command's program are bound read-only besides the system and the Python environment."""
        if self.kind == "none":
            return cmd
        readable = [*python_paths(), *(Path(p) for p in (python_path or "").split(":") if p)]
        if os.path.isabs(cmd[0]):  # a tune command outside the Python environment
            readable.append(Path(cmd[0]).resolve().parent)
        return ["bwrap", *self.binds(workdir, readable), "--", *cmd]

    def exit_status(self, returncode: int) -> int:
        """The wrapped command's own status, as Popen reports an unwrapped one: bubblewrap, the
        namespace's init, exits 128+N when its command dies of signal N."""
        if self.kind == "bwrap" and 128 < returncode < 128 + signal.NSIG:
            return -(returncode - 128)
        return returncode

    def binds(self, workdir: Path, readable: Iterable[Path]) -> list[str]:
        size = ["--size", str(self.memory_folder_bytes)]
        args = ["--proc", "/proc", *size, "--tmpfs", "/tmp"]  # first: a venv in /tmp binds over
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
        for path in ETC_FILES:
            args += ["--ro-bind-try", path, path]
        for path in _outermost(readable):
            args += ["--ro-bind", str(path), str(path)]
        if self.share_devices:
            args += ["--dev-bind", "/dev", "/dev", "--ro-bind-try", "/sys", "/sys"]
            args += [*size, "--tmpfs", "/dev/shm"]  # never the host's shared memory
        else:  # a /dev of its own, read-only but for a capped /dev/shm (Python's semaphores)
            args += ["--dev", "/dev", *size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
            for path in CPU_SYS:
                args += ["--ro-bind-try", path, path]
        for path in (workdir, *self.writable):
            args += ["--bind", str(path), str(path)]
        for path in self.read_only:
            args += ["--ro-bind", str(path), str(path)]
        args += ["--unshare-all", "--die-with-parent", "--new-session", "--chdir", str(workdir)]
        return args


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


def resolve_sandbox(mode: SandboxMode) -> SandboxKind:
    """`auto` and `bwrap` both mean bubblewrap, and raise SandboxUnavailable where it cannot
    run; only an explicit `none` tunes without it, and says so loudly."""
    if mode == "none":
        _warn_unsandboxed()
        return "none"
    if not bwrap_works():
        raise SandboxUnavailable(f"FXTUNE_WORKER_SANDBOX={mode}: {NO_BWRAP}")
    return "bwrap"


def choose_sandbox(
    mode: SandboxMode, writable: tuple[Path, ...] = (), share_devices: bool = False
) -> Sandbox:
    return Sandbox(resolve_sandbox(mode), writable, share_devices)


@functools.cache
def _warn_unsandboxed() -> None:
    log.warning(
        "FXTUNE_WORKER_SANDBOX=none: tuning children run WITHOUT A SANDBOX (resource limits and "
        "a private TMPDIR only). An uploaded program can read every file this user can (the "
        "service's database and uploads included) and reach the network. Install Debian's "
        "bubblewrap and unset FXTUNE_WORKER_SANDBOX unless another boundary (a VM) isolates "
        "this worker"
    )


@dataclass(frozen=True)
class ChildResult:
    returncode: int
    error: str | None
    timed_out: bool = False
    cancelled: bool = False
    stacks: str | None = None  # where a stopped child was, once it overran (`overrun_stacks`)

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
            return " ".join(lines[i:])[:MAX_ERROR_CHARS]
    return lines[-1][:MAX_ERROR_CHARS]


def _tail(path: Path, size: int = 64_000) -> str:
    """The end of a file however large the child made it."""
    with path.open("rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - size))
        return f.read().decode("utf-8", "replace")


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exited with status {code}"
    name = signal.Signals(-code).name
    hints = {"SIGXCPU": " (CPU-time limit)", "SIGKILL": " (killed: out of memory?)"}
    return f"killed by {name}{hints.get(name, '')}"


MAX_LINE_CHARS = 64_000  # a progress line is small; longer ones are dropped unread


def bounded_lines(stream: object, limit: int = MAX_LINE_CHARS) -> Iterator[str]:
    """Lines of at most `limit` characters; a longer one is skipped (never held whole)."""
    skipping = False
    while True:
        part = stream.readline(limit)  # type: ignore[attr-defined]
        if not part:
            return
        whole = part.endswith("\n")
        if not skipping and whole:
            yield part
        skipping = not whole


def _relay(stream: object, on_progress: Progress, redact: Redact) -> None:
    for raw in bounded_lines(stream):
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            event = json.loads(raw)
            message = redact(str(event.get("message", "")), MAX_PROGRESS_CHARS)
            on_progress(float(event["progress"]), message)


def kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def spawn_child(
    cmd: list[str],
    limits: Limits,
    workdir: Path,
    env: dict[str, str] | None = None,
    sandbox: Sandbox = Sandbox(),
    stdin: int = subprocess.DEVNULL,
) -> subprocess.Popen[str]:
    """Start `cmd` with `limits` (all but the wall clock, which `wait_child` keeps), in its own
    process group, under `sandbox`, with the allowlisted environment plus `env`; its stdout is
    a pipe and its stderr goes to `workdir/stderr.log`. Raises OSError when it cannot start."""
    child_env = child_environment(workdir, env)
    with (workdir / "stderr.log").open("w") as stderr:
        return subprocess.Popen(
            sandbox.wrap(cmd, workdir, child_env.get("PYTHONPATH")),
            cwd=workdir,
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=child_env,
            start_new_session=True,
            preexec_fn=_apply_limits(limits),
        )


def wait_child(
    proc: subprocess.Popen[str],
    limits: Limits,
    workdir: Path,
    deadline: float,
    cancelled: Callable[[], bool] = lambda: False,
    reader: threading.Thread | None = None,
    redact: Redact = _cut,
    sandbox: Sandbox = Sandbox(),
) -> ChildResult:
    """Wait for a child of `spawn_child` until it exits, `cancelled()` or the monotonic
    `deadline`; then kill its whole group and say how it ended (its error from its stderr;
    a signal as a negative code, under bubblewrap too: `sandbox` is the one it started in)."""
    timed_out = was_cancelled = False
    while proc.poll() is None:
        if time.monotonic() > deadline:
            timed_out = True
        elif cancelled():
            was_cancelled = True
        if timed_out or was_cancelled:
            kill_group(proc)
            proc.wait()
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    kill_group(proc)  # anything the child left running in its group
    if reader is not None:
        reader.join(timeout=5)
    code = sandbox.exit_status(proc.returncode)
    if code == 0 and not (timed_out or was_cancelled):
        return ChildResult(0, None)
    if timed_out or was_cancelled:
        stopped = (
            f"tuning timed out after {limits.wall_s:g}s and was killed"
            if timed_out
            else "tuning was cancelled"
        )
        stacks = overrun_stacks(_tail(workdir / "stderr.log"))
        stacks = redact(stacks, MAX_ERROR_CHARS) if stacks else None
        error = with_stacks(stopped, stacks)
        return ChildResult(code, redact(error, MAX_ERROR_CHARS), timed_out, was_cancelled, stacks)
    tail = _tail(workdir / "stderr.log")
    detail = error_line(redact(tail, len(tail) + len(REDACTED) * 64))
    error = detail if detail and code > 0 else f"tuner {_describe_exit(code)}"
    if detail and code < 0:
        error = f"tuner {_describe_exit(code)}: {detail}"
    return ChildResult(code, redact(error, MAX_ERROR_CHARS))


STACKS_MARK = "(most recent call first)"


def with_stacks(message: str, stacks: str | None) -> str:
    """`message`, and where the child was when it overran its budget, if it dumped that."""
    return f"{message}; where it was when it overran its budget: {stacks}" if stacks else message


def overrun_stacks(stderr_tail: str) -> str | None:
    """The innermost frames of the last stack dump in a child's stderr (`fxtune tune` dumps its
    threads' stacks when it overruns its budget by a minute: `tuner.cli`), on one line."""
    at = stderr_tail.rfind(STACKS_MARK)
    if at < 0:
        return None
    frames = [ln.strip() for ln in stderr_tail[at:].splitlines()[1:] if ln.strip()]
    return " < ".join(frames[:8]) or None


def run_child(
    cmd: list[str],
    limits: Limits,
    workdir: Path,
    on_progress: Progress,
    cancelled: Callable[[], bool] = lambda: False,
    on_started: Callable[[], None] | None = None,
    env: dict[str, str] | None = None,
    sandbox: Sandbox = Sandbox(),
    redact: Redact = _cut,
) -> ChildResult:
    """Run `cmd`; stdout carries JSON progress lines, stderr goes to a file for the error.

    The child's environment is `tuner.host.child_env.child_environment` (an allowlist) plus `env`.
    Progress messages (at most 500 characters) and the error (a few KB) pass through `redact`,
    which masks the caller's secrets before they are relayed anywhere.

    Start other threads in `on_started`, not before: `preexec_fn` is only safe to fork from a
    process that runs no other thread.
    """
    try:
        proc = spawn_child(cmd, limits, workdir, env, sandbox)
    except OSError as exc:
        return ChildResult(127, f"cannot start the tuner ({cmd[0]}): {exc}")
    reader = threading.Thread(target=_relay, args=(proc.stdout, on_progress, redact), daemon=True)
    reader.start()
    if on_started is not None:
        on_started()
    deadline = time.monotonic() + limits.wall_s
    return wait_child(proc, limits, workdir, deadline, cancelled, reader, redact, sandbox)
