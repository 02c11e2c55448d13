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
- a backend built in the process that runs it (torch.compile, CUDA graphs) is probed: the child
  builds and runs it once, and only a candidate that survives is built again in the tuner (on
  inductor's warm cache). Probing costs a child per candidate, so the tuner does it where
  crashes were seen (CUDA, issue 11) or when asked (`TuneOptions.isolate_compiles`).

`python -m tuner.backends.child PROGRAM.pt2 PACKAGE.aoti.pt2 [--instrumented]`
`python -m tuner.backends.child PROGRAM.pt2 --probe BACKEND`
"""

from __future__ import annotations

import getpass
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tuner.contract.errors import CompileCrashed, CompileFailed, CompileOverrun
from tuner.host.child_env import fxtune_python_path

# The child's module; a test points it at a child that crashes for real.
CHILD_MODULE = "tuner.backends.child"


@dataclass(frozen=True)
class ChildCompile:
    package: Path
    seconds: float  # the whole child, start to exit
    compile_s: float  # of which compiling (the rest: starting Python, importing torch)


def _child_env(scratch: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = fxtune_python_path(env.get("PYTHONPATH"))
    # inductor's default cache folder, as it would be without the child's own TMPDIR
    user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    default_cache = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}")
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", default_cache)
    env["TMPDIR"] = scratch
    return env


def compile_aoti_in_child(
    program_path: Path, package_path: Path, *, timeout_s: float, instrumented: bool = False
) -> ChildCompile:
    """Compile PROGRAM.pt2 to an AOTInductor package in a child killed after `timeout_s`."""
    args = [str(program_path), str(package_path)] + (["--instrumented"] if instrumented else [])
    seconds, report = _run_child(args, timeout_s, "the package", "AOTInductor compile")
    return ChildCompile(Path(report["package"]), seconds, float(report["compile_s"]))


def probe_in_child(program_path: Path, backend: str, *, timeout_s: float) -> ChildCompile:
    """Build PROGRAM.pt2 under `backend` and run it once, in a child killed after `timeout_s`."""
    what = f"under {backend}"
    seconds, report = _run_child(
        [str(program_path), "--probe", backend], timeout_s, what, f"{backend} probe"
    )
    return ChildCompile(program_path, seconds, float(report["compile_s"]))


def _run_child(args: list[str], timeout_s: float, what: str, action: str) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", CHILD_MODULE, *args]
    started = time.monotonic()
    # A killed compiler leaves its temporary files: the child gets a temp folder of its own,
    # removed here whatever happened; inductor's cache stays where it would have been.
    with tempfile.TemporaryDirectory(prefix="fxtune-compile-") as scratch:
        proc = subprocess.Popen(
            cmd,
            env=_child_env(scratch),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=max(timeout_s, 0.0))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            overrun = True
        else:
            overrun = False
    if overrun:
        raise CompileOverrun(
            f"compile stopped after {time.monotonic() - started:.1f} s: "
            f"it did not finish in the {timeout_s:.1f} s left of the time budget"
        ) from None
    seconds = time.monotonic() - started
    if proc.returncode < 0:
        number = -proc.returncode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = "an unknown signal"
        raise CompileCrashed(name, number, what)
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise CompileFailed(f"{action} failed: {tail[0]}")
    return seconds, json.loads(out.decode().strip().splitlines()[-1])
