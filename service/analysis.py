"""Checks of untrusted programs, each in a short-lived, capped, sandboxed child.

The API process streams uploads, checks the zip directory and stores; it never builds a graph
from an upload. Fingerprinting an upload (with its resource bounds), loading a worker's tuned
program and verifying it against the original all run as `python -m tuner.checks.inspect` in a child
with an address-space, CPU-time and wall-clock cap, an allowlisted environment and, where
bubblewrap runs, namespaces that show it only the system, the Python environment and a folder
holding the files it checks, read-only (`service.check_folder`, `tuner.host.sandbox`). The
service only reads the child's JSON answer. One child checks one thing and exits; so that an
upload does not wait for a Python to import torch, `FXTUNE_WARM_CHECKERS` of them are started
ahead, already sandboxed and warmed up, and each check takes one (`service.warm_checkers`).

Unlike a worker's tuning child, this one runs nothing the upload says: the program JSON is
checked against fxtune's schema and the graph is only fake-propagated. So where bubblewrap cannot
run, `auto` still checks (with the caps), says so once in the log, and `bwrap` refuses to.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from service.check_folder import CheckFolder
from service.check_gate import CheckGate, check_capacity
from service.core.config import Settings
from service.warm_checkers import WarmCheckers, WarmChild
from tuner.contract.exit_codes import ExitCode
from tuner.host.child_env import fxtune_python_path
from tuner.host.sandbox import (
    ChildResult,
    Limits,
    Sandbox,
    bwrap_works,
    run_child,
    spawn_child,
    wait_child,
)

log = logging.getLogger("fxtune.service")

AnalysisSandbox = Literal["auto", "bwrap", "none"]
INSPECT = "tuner.checks.inspect"
RESULT = "result.json"
MAX_RESULT_BYTES = 1 << 20


class UnloadableProgram(ValueError):
    """The program is refused or unreadable, or its check ran past its limits (says why)."""


class AnalysisUnavailable(RuntimeError):
    """The check could not run at all here (no sandbox where one is required): the server's
    fault, not the file's (HTTP 503)."""


class AnalysisFailed(RuntimeError):
    """The check itself failed (the checker exited 1: a bug, or this host): the server's fault,
    not the file's (HTTP 500). Never "cannot be loaded": that is a verdict on the file."""


@dataclass(frozen=True)
class AnalysisLimits:
    memory_bytes: int
    cpu_s: int
    wall_s: float
    sandbox: AnalysisSandbox = "auto"


@functools.cache
def _warn_no_bwrap() -> None:
    log.warning(
        "bubblewrap cannot run here: uploaded programs are checked in a child with resource "
        "limits and an allowlisted environment but no namespaces (install Debian's bubblewrap; "
        "FXTUNE_ANALYSIS_SANDBOX=bwrap makes it required)"
    )


def _sandbox(mode: AnalysisSandbox) -> Sandbox:
    if mode == "none":
        return Sandbox("none")
    if bwrap_works():
        return Sandbox("bwrap")
    if mode == "bwrap":
        raise AnalysisUnavailable("FXTUNE_ANALYSIS_SANDBOX=bwrap, but bubblewrap cannot run here")
    _warn_no_bwrap()
    return Sandbox("none")


def _argv(args: list[str], placed: dict[str, str]) -> list[str]:
    """The check's command line, its file names as the child finds them, and where it answers."""
    return [*(placed.get(a, a) for a in args), "--out", RESULT]


def _answer(done: ChildResult, folder: CheckFolder) -> dict[str, Any] | None:
    """The child's JSON answer, read only up to MAX_RESULT_BYTES: a subverted child could write
    any amount, and an answer is a fingerprint and a few figures."""
    if not done.ok:
        return None
    with (folder.path / RESULT).open("rb") as f:
        raw = f.read(MAX_RESULT_BYTES + 1)
    if len(raw) > MAX_RESULT_BYTES:
        raise UnloadableProgram(f"the check's answer is over {MAX_RESULT_BYTES} bytes: refused")
    return json.loads(raw)


def analysis_limits(settings: Settings) -> AnalysisLimits:
    return AnalysisLimits(
        memory_bytes=settings.analysis_memory_mb * 2**20,
        cpu_s=settings.analysis_cpu_s,
        wall_s=settings.analysis_wall_s,
        sandbox=settings.analysis_sandbox,
    )


def program_analysis(settings: Settings) -> ProgramAnalysis:
    """The service's checker, with its limits read once from the settings."""
    limits = analysis_limits(settings)
    gate = CheckGate(check_capacity(settings))
    root = settings.data_dir / "analysis"
    return ProgramAnalysis(root, limits, warm=settings.warm_checkers, gate=gate)


@dataclass(frozen=True)
class CheckRun:
    """How one check ran: by a `warm` child (started before the check; `was_ready` when it had
    warmed up by then) or by a cold one started for it."""

    warm: bool
    was_ready: bool
    pid: int | None
    seconds: float


Outcome = tuple[ChildResult, dict[str, Any] | None]


class ProgramAnalysis:
    """Runs `tuner.checks.inspect` commands, each in its own child and folder under `root`.

    With `warm` > 0 that many children wait, started ahead (`service.warm_checkers`), between
    `start` and `close`; a check without one starts its own. `module` is the checking program
    (`python -m MODULE`), replaceable for tests that need a child to misbehave. `gate` bounds
    the checks running at once (`service.check_gate`; the service always has one); a check of
    a worker's result is marked `result` and goes ahead of waiting uploads.
    """

    def __init__(
        self,
        root: Path,
        limits: AnalysisLimits,
        warm: int = 0,
        module: str = INSPECT,
        gate: CheckGate | None = None,
    ) -> None:
        self.root = root
        self.limits = limits
        self.module = module
        self.gate = gate
        self.pool = WarmCheckers(warm, self._spawn_warm) if warm > 0 else None
        self.recent: deque[CheckRun] = deque(maxlen=64)

    def start(self) -> None:
        """Remove what killed processes left here, and start the warm children."""
        CheckFolder.clear_leftovers(self.root)
        if self.pool is not None:
            self.pool.start()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def _caps(self) -> Limits:
        return Limits(
            wall_s=self.limits.wall_s,
            cpu_s=self.limits.cpu_s,
            address_space_bytes=self.limits.memory_bytes,
        )

    def _sandbox(self, folder: CheckFolder) -> Sandbox:
        return replace(_sandbox(self.limits.sandbox), read_only=(folder.inputs,))

    @staticmethod
    def _env() -> dict[str, str]:
        return {"PYTHONPATH": fxtune_python_path(os.environ.get("PYTHONPATH"))}

    def _spawn_warm(self) -> tuple[subprocess.Popen[str], CheckFolder]:
        folder = CheckFolder(self.root, "warm-")
        try:
            cmd = [sys.executable, "-m", self.module, "warm"]
            sandbox = self._sandbox(folder)
            pipe = subprocess.PIPE
            proc = spawn_child(cmd, self._caps(), folder.path, self._env(), sandbox, pipe)
        except BaseException:
            folder.remove()
            raise
        return proc, folder

    def _run(
        self, args: list[str], files: dict[str, Path], what: str, result: bool = False
    ) -> dict[str, Any]:
        """`python -m MODULE ARGS --out result.json` with `files` in the child's `in/`, once
        the gate gives the check a slot (ChecksBusy where it does not)."""
        if self.gate is None:
            return self._run_now(args, files, what)
        with self.gate.slot(result):
            return self._run_now(args, files, what)

    def _run_now(self, args: list[str], files: dict[str, Path], what: str) -> dict[str, Any]:
        started = time.monotonic()
        child = self.pool.take() if self.pool is not None else None
        was_ready = child is not None and child.ready
        outcome = self._run_warm(child, args, files) if child is not None else None
        warm = outcome is not None
        if outcome is None:  # no warm child, or it died before it got the job
            outcome = self._run_cold(args, files)
        done, result = outcome
        pid = child.pid if warm and child is not None else None
        run = CheckRun(warm, warm and was_ready, pid, time.monotonic() - started)
        self.recent.append(run)
        log.debug("checked %s: %s", what, run)
        if result is not None:
            return result
        detail = (done.error or "").removeprefix("error: ")
        if done.returncode in (ExitCode.USER_INPUT, ExitCode.REFUSED):
            raise UnloadableProgram(f"{what} cannot be loaded safely: {detail}")
        if done.timed_out:
            raise UnloadableProgram(
                f"checking {what} took longer than its {self.limits.wall_s:g} s limit"
            )
        if done.returncode < 0:  # killed by a signal: its CPU limit (SIGXCPU), or a crash
            raise UnloadableProgram(
                f"checking {what} failed within its limits "
                f"({self.limits.memory_bytes >> 20} MiB, {self.limits.cpu_s} s of CPU): {detail}"
            )
        log.error(
            "checking %s failed with an internal error (exit %d): %s", what, done.returncode, detail
        )
        raise AnalysisFailed(f"checking {what} failed with an internal error; nothing was stored")

    def _run_cold(self, args: list[str], files: dict[str, Path]) -> Outcome:
        """A child started for this check (the only way with FXTUNE_WARM_CHECKERS=0)."""
        folder = CheckFolder(self.root, "check-")
        try:
            argv = _argv(args, folder.place(files))
            cmd = [sys.executable, "-m", self.module, *argv]
            done = run_child(
                cmd,
                self._caps(),
                folder.path,
                lambda *_: None,
                env=self._env(),
                sandbox=self._sandbox(folder),
            )
            return done, _answer(done, folder)
        finally:
            folder.remove()

    def _run_warm(
        self, child: WarmChild, args: list[str], files: dict[str, Path]
    ) -> Outcome | None:
        """The check by a warm child, under the same limits, the wall clock counted from now;
        None when the child died before it got the job (the check then runs cold)."""
        deadline = time.monotonic() + self.limits.wall_s
        try:
            argv = _argv(args, child.folder.place(files))
            readiness = child.wait_ready(deadline)
            if readiness == "ended" or (readiness == "ready" and not child.hand(argv)):
                return None
            done = wait_child(
                child.proc,
                self._caps(),
                child.folder.path,
                deadline,
                reader=child.reader,
                sandbox=self._sandbox(child.folder),
            )
            return done, _answer(done, child.folder)
        finally:
            child.stop()

    def fingerprint(
        self, path: Path, what: str = "the uploaded program", result: bool = False
    ) -> str:
        """The upload's fingerprint, after its schema, operators and resource bounds passed
        (`result`: needed to check a worker's result)."""
        answer = self._run(["fingerprint", "program.pt2"], {"program.pt2": path}, what, result)
        return str(answer["fingerprint"])

    def check_loadable(self, path: Path, what: str = "the tuned program") -> None:
        self._run(["load", "program.pt2"], {"program.pt2": path}, what, result=True)

    def check_runtime(self, path: Path, runtime: str, what: str) -> str | None:
        """Refuse a runtime artifact (an ONNX file, an OpenVINO IR zip) that is not data alone
        (`tuner.checks.runtime_artifact`); None when it passed, else why it could not be
        checked here (the caller then does not store it)."""
        args = ["runtime", runtime, "artifact"]
        answer = self._run(args, {"artifact": path}, what, result=True)
        return None if answer.get("checked") else str(answer.get("reason") or "not checked")

    def verify(self, original: Path, tuned: Path, config: dict[str, Any], what: str) -> None:
        """Refuse a tuned program whose outputs differ from the original's on fresh inputs."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=self.root) as f:
            json.dump(config, f)
            f.flush()
            files = {"original.pt2": original, "tuned.pt2": tuned, "config.json": Path(f.name)}
            args = ["verify", "original.pt2", "tuned.pt2", "--config", "config.json"]
            result = self._run(args, files, what, result=True)
        if result.get("mismatch"):
            raise UnloadableProgram(
                f"{what} does not answer as the original upload does: {result['mismatch']}"
            )
