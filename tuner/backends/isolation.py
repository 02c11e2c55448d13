"""Compiles in a child process: an overrun can be stopped and a crash is contained.

A compile inside the tuner's own process cannot be interrupted; in a child (its own process
group, so inductor's compile workers and the C++ compiler go with it) it is killed when its
time is up. The child also runs the result once on the example inputs, so native code that
kills its process (a segfault, an abort, a CUDA error) kills the child, and the tuner records
the candidate as crashed, with the signal, and goes on. The child reports how long the compile
itself took, so compile-time estimates do not mistake starting Python and importing torch for
lowering the graph.

Two uses:
- an AOTInductor package is compiled in the child, and the tuner loads the package it wrote;
- a backend compiled in the process that runs it (torch.compile) is probed: the child
  builds and runs it once, and only a candidate that survives is built again in the tuner (on
  inductor's warm cache). Probing costs a child per candidate, so the tuner does it where
  crashes were seen (CUDA, issue 11) or when asked (`TuneOptions.isolate_compiles`).

A third: a runtime's artifact (an ONNX file, an OpenVINO IR) is written in the child, which
loads it and runs it once (`tuner.backends.runtime_build`), and the tuner loads the file.

Each child is started as `python -m tuner.backends.child --wait` and given its job on stdin
(`PROGRAM.pt2 PACKAGE.aoti.pt2 [--instrumented]`, `PROGRAM.pt2 --probe BACKEND` or
`PROGRAM.pt2 --runtime RUNTIME ARTIFACT`); `Children` can start the next one while the current
one works.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.backends.child_protocol import ANSWER
from tuner.contract.errors import CompileCrashed, CompileFailed, CompileOverrun
from tuner.host.child_env import fxtune_python_path

# The child's module; a test points it at a child that crashes for real.
CHILD_MODULE = "tuner.backends.child"


@dataclass(frozen=True)
class ChildCompile:
    package: Path
    seconds: float  # the child's job, given to exit (a child started for it: from its start)
    compile_s: float  # of which compiling (the rest: loading the program, exiting; starting
    # Python and importing torch where the child was not started ahead)
    # torch's thread count in the child while it built: inductor's CPU code depends on it (on
    # one thread it emits no OpenMP loops), so it is the machine's, not the count the tuner
    # measures on (None from a child that did not say)
    threads: int | None = None


def _inductor_home() -> str:
    """inductor's default folder for this user under this process's temp folder: where the
    compile cache goes unless TORCHINDUCTOR_CACHE_DIR says otherwise, and where its
    precompiled headers always go (torch derives their folder from the temp folder alone)."""
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    return os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")


def _child_env(scratch: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = fxtune_python_path(env.get("PYTHONPATH"))
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", _inductor_home())
    env["TMPDIR"] = scratch
    return env


def _share_inductor_home(scratch: str) -> None:
    """Point the child's inductor folder at this process's, so the precompiled headers of an
    AOTInductor build (two, about 150 MB and 6 s of g++ each on this machine's CPU) are made
    once and reused, not rebuilt in every child's temporary folder and thrown away with it.
    The link, not what it points to, goes when the folder is removed."""
    home = _inductor_home()
    os.makedirs(home, exist_ok=True)
    os.symlink(home, os.path.join(scratch, os.path.basename(home)))


class _Child:
    """One started child: waiting for its job on stdin (`tuner.backends.child --wait`), with a
    temporary folder of its own, removed once it has ended."""

    def __init__(self, device: str | None) -> None:
        self.scratch = tempfile.TemporaryDirectory(prefix="fxtune-compile-")
        _share_inductor_home(self.scratch.name)
        cmd = [sys.executable, "-m", CHILD_MODULE, "--wait"]
        if device is not None:
            cmd += ["--device", device]
        self.proc = subprocess.Popen(
            cmd,
            env=_child_env(self.scratch.name),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def ready(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError):
            self.proc.communicate(timeout=5)
        self.scratch.cleanup()


class _Served:
    """A child serving jobs one after another (`tuner.backends.child --serve`): the runtimes'
    builds, a few seconds each, would otherwise each pay for starting Python and importing
    torch (4-6 s here). Its stderr goes to a file in its folder, so a chatty converter cannot
    fill a pipe nobody reads."""

    def __init__(self) -> None:
        self.scratch = tempfile.TemporaryDirectory(prefix="fxtune-build-")
        _share_inductor_home(self.scratch.name)
        self.stderr_path = Path(self.scratch.name) / "stderr.txt"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, "--serve"],
            env=_child_env(self.scratch.name),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, args: list[str], timeout_s: float) -> dict | None:
        """Send one job and wait for its answer; None when the child ended without one.
        Raises TimeoutError when no answer came in `timeout_s`."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps(args) + "\n").encode())
        self.proc.stdin.flush()
        deadline = time.monotonic() + max(timeout_s, 0.0)
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TimeoutError
                line = self.proc.stdout.readline()
                if not line:
                    return None
                text = line.decode(errors="replace")
                if text.startswith(ANSWER):
                    return json.loads(text[len(ANSWER) :])

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError):
            lines = self.stderr_path.read_text(errors="replace").strip().splitlines()
            if lines:
                return lines[-1]
        return "no message"

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.communicate(timeout=5)
        self._stderr.close()
        self.scratch.cleanup()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "an unknown signal"


class Children:
    """Compile children, one per compile or probe, each used once, so a crash or an overrun
    ends only its own.

    With `ahead`, the next child is started while the current one works (and by `start`, as a
    run begins), so its Python start and torch import are not paid inside the budget: on the
    H200 (torch 2.11, 16 cores) each CUDA-graph probe took 8.8-10.2 s, almost all of it
    starting the child, and two probes spent the recsys example's 26 s of tuning at 45 s. A
    waiting child uses no CPU; it only competes for the cores while its import overlaps the
    child before it, not with a timing. `device`: a CUDA device to create its context on in
    advance. `close` ends the waiting one.
    """

    def __init__(self, *, ahead: bool = False, device: str | None = None) -> None:
        self.ahead = ahead
        self.device = device
        self._next: _Child | None = None
        self._served: _Served | None = None

    def start_serving(self) -> None:
        """Start the child that `serve` hands its jobs to, if none is running."""
        if self._served is None or not self._served.alive():
            if self._served is not None:
                self._served.stop()
            self._served = _Served()

    def serve(
        self, args: list[str], timeout_s: float, what: str, action: str
    ) -> tuple[float, dict]:
        """Run one job (`tuner.backends.child`'s arguments) in the serving child, which stays
        for the next job when this one ends in an answer; one that overruns `timeout_s` or
        crashes ends it (and the next job starts another). As `run`, its seconds and report."""
        self.start_serving()
        served = self._served
        assert served is not None
        started = time.monotonic()
        try:
            report = served.ask(args, timeout_s)
        except TimeoutError:
            served.stop()
            self._served = None
            raise CompileOverrun(
                f"compile stopped after {time.monotonic() - started:.1f} s: "
                f"it did not finish in the {timeout_s:.1f} s left of the time budget"
            ) from None
        seconds = time.monotonic() - started
        if report is None:
            code = served.proc.wait()
            tail = served.stderr_tail()
            served.stop()
            self._served = None
            if code < 0:
                raise CompileCrashed(_signal_name(-code), -code, what)
            raise CompileFailed(f"{action} failed: {tail}")
        if "error" in report:
            raise CompileFailed(f"{action} failed: {report['error']}")
        return seconds, report

    def start(self) -> None:
        """Start the next child now, if children are started ahead and none is waiting."""
        if self.ahead and self._next is None:
            self._next = _Child(self.device)

    def _take(self) -> _Child:
        child, self._next = self._next, None
        if child is not None and not child.ready():  # it died waiting: it tells nothing
            child.stop()
            child = None
        child = child or _Child(self.device)
        self.start()  # the one after it starts while this one works
        return child

    def run(self, args: list[str], timeout_s: float, what: str, action: str) -> tuple[float, dict]:
        """Run one job (`tuner.backends.child`'s arguments) in a child stopped after
        `timeout_s`: its seconds from the job's start, and its report."""
        child = self._take()
        started = time.monotonic()
        try:
            out, err = child.proc.communicate(
                (json.dumps(args) + "\n").encode(), timeout=max(timeout_s, 0.0)
            )
        except subprocess.TimeoutExpired:
            raise CompileOverrun(
                f"compile stopped after {time.monotonic() - started:.1f} s: "
                f"it did not finish in the {timeout_s:.1f} s left of the time budget"
            ) from None
        finally:
            child.stop()  # its process group: inductor's workers and the C++ compiler too
        seconds = time.monotonic() - started
        code = child.proc.returncode
        if code < 0:
            number = -code
            try:
                name = signal.Signals(number).name
            except ValueError:
                name = "an unknown signal"
            raise CompileCrashed(name, number, what)
        if code != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
            raise CompileFailed(f"{action} failed: {tail[0]}")
        return seconds, json.loads(out.decode().strip().splitlines()[-1])

    def close(self) -> None:
        child, self._next = self._next, None
        if child is not None:
            child.stop()
        served, self._served = self._served, None
        if served is not None:
            served.stop()

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def compile_aoti_in_child(
    program_path: Path,
    package_path: Path,
    *,
    timeout_s: float,
    instrumented: bool = False,
    settings: str | None = None,
    children: Children | None = None,
) -> ChildCompile:
    """Compile PROGRAM.pt2 to an AOTInductor package in a child killed after `timeout_s`
    (one of `children`, else one started for it), with inductor's `settings` (a name of
    `tuner.backends.inductor_settings`; None: its defaults)."""
    args = [str(program_path), str(package_path)] + (["--instrumented"] if instrumented else [])
    args += ["--settings", settings] if settings else []
    seconds, report = _run_child(children, args, timeout_s, "the package", "AOTInductor compile")
    package = Path(report["package"])
    return ChildCompile(package, seconds, float(report["compile_s"]), report.get("threads"))


def probe_in_child(
    program_path: Path, backend: str, *, timeout_s: float, children: Children | None = None
) -> ChildCompile:
    """Build PROGRAM.pt2 under `backend` and run it once, in a child killed after `timeout_s`."""
    what = f"under {backend}"
    args = [str(program_path), "--probe", backend]
    seconds, report = _run_child(children, args, timeout_s, what, f"{backend} probe")
    return ChildCompile(program_path, seconds, float(report["compile_s"]), report.get("threads"))


def runtime_in_child(
    program_path: Path,
    runtime: str,
    artifact: Path,
    *,
    timeout_s: float,
    children: Children | None = None,
) -> ChildCompile:
    """Write `runtime`'s artifact of PROGRAM.pt2 to `artifact` and run it once, in a child
    killed after `timeout_s`."""
    args = [str(program_path), "--runtime", runtime, str(artifact)]
    what, action = f"the {runtime} artifact", f"{runtime} build"
    if children is not None:
        seconds, report = children.serve(args, timeout_s, what, action)
    else:
        seconds, report = _run_child(None, args, timeout_s, what, action)
    return ChildCompile(
        Path(report["artifact"]), seconds, float(report["compile_s"]), report.get("threads")
    )


def _run_child(
    children: Children | None, args: list[str], timeout_s: float, what: str, action: str
) -> tuple[float, dict]:
    if children is not None:
        return children.run(args, timeout_s, what, action)
    with Children() as once:
        return once.run(args, timeout_s, what, action)
