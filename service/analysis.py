"""Checks of untrusted programs, each in a short-lived, capped, sandboxed child.

The API process streams uploads, checks the zip directory and stores; it never builds a graph
from an upload. Fingerprinting an upload (with its resource bounds), loading a worker's tuned
program and verifying it against the original all run as `python -m tuner.checks.inspect` in a child
with an address-space, CPU-time and wall-clock cap, an allowlisted environment and, where
bubblewrap runs, namespaces that show it only the system, the Python environment and a folder
holding the files it checks (`tuner.host.sandbox`). The service only reads the child's JSON answer.

Unlike a worker's tuning child, this one runs nothing the upload says: the program JSON is
checked against fxtune's schema and the graph is only fake-propagated. So where bubblewrap cannot
run, `auto` still checks (with the caps), says so once in the log, and `bwrap` refuses to.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from service.core.config import Settings
from tuner.contract.exit_codes import ExitCode
from tuner.host.sandbox import Limits, Sandbox, bwrap_works, run_child

log = logging.getLogger("fxtune.service")

AnalysisSandbox = Literal["auto", "bwrap", "none"]


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


def _place(src: Path, dst: Path) -> None:
    """The checked file inside the child's folder: a hard link where it can be, else a copy."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def program_analysis(settings: Settings) -> ProgramAnalysis:
    """The service's checker, with its limits read once from the settings."""
    limits = AnalysisLimits(
        memory_bytes=settings.analysis_memory_mb * 2**20,
        cpu_s=settings.analysis_cpu_s,
        wall_s=settings.analysis_wall_s,
        sandbox=settings.analysis_sandbox,
    )
    return ProgramAnalysis(settings.data_dir / "analysis", limits)


class ProgramAnalysis:
    """Runs `tuner.checks.inspect` commands on files in a fresh folder under `root`."""

    def __init__(self, root: Path, limits: AnalysisLimits) -> None:
        self.root = root
        self.limits = limits

    def _run(self, args: list[str], files: dict[str, Path], what: str) -> dict[str, Any]:
        """`python -m tuner.checks.inspect ARGS --out result.json` in a new folder with `files`."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="check-", dir=self.root) as tmp:
            work = Path(tmp)
            for name, src in files.items():
                _place(src, work / name)
            cmd = [sys.executable, "-m", "tuner.checks.inspect", *args, "--out", "result.json"]
            limits = Limits(
                wall_s=self.limits.wall_s,
                cpu_s=self.limits.cpu_s,
                address_space_bytes=self.limits.memory_bytes,
            )
            env = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}
            done = run_child(
                cmd, limits, work, lambda *_: None, env=env, sandbox=_sandbox(self.limits.sandbox)
            )
            if done.ok:
                return json.loads((work / "result.json").read_text())
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

    def fingerprint(self, path: Path, what: str = "the uploaded program") -> str:
        """The upload's fingerprint, after its schema, operators and resource bounds passed."""
        result = self._run(["fingerprint", "program.pt2"], {"program.pt2": path}, what)
        return str(result["fingerprint"])

    def check_loadable(self, path: Path, what: str = "the tuned program") -> None:
        self._run(["load", "program.pt2"], {"program.pt2": path}, what)

    def verify(self, original: Path, tuned: Path, config: dict[str, Any], what: str) -> None:
        """Refuse a tuned program whose outputs differ from the original's on fresh inputs."""
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".json", dir=self.root) as f:
            json.dump(config, f)
            f.flush()
            files = {"original.pt2": original, "tuned.pt2": tuned, "config.json": Path(f.name)}
            args = ["verify", "original.pt2", "tuned.pt2", "--config", "config.json"]
            result = self._run(args, files, what)
        if result.get("mismatch"):
            raise UnloadableProgram(
                f"{what} does not answer as the original upload does: {result['mismatch']}"
            )
