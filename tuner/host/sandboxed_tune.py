"""`fxtune tune` run again as a child, in the sandbox the worker's jobs run in.

Tuning compiles the program, and a compile of an untrusted program is native code generation
(Inductor's C++, the AOTInductor wrapper): so the command line tunes the way the worker does. The
child runs under bubblewrap (`tuner.host.sandbox`) in a private folder: the program hard-linked
(else copied) into `in/`, read-only, a snapshot of the user's caches beside it, read-only too,
and `out/`, where it writes. Nothing else of the user's files is there: not the folder of the
outputs (which may be a source tree), not the caches it reads. When it succeeds, the files its
report names are copied to where the user asked, the report's paths rewritten for that place,
and what it measured merged into the user's caches after the same checks as a worker's
(`tuner.host.job_caches`). It is killed at its budget plus `tuner.contract.budget.KILL_MARGIN_S`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.contract.budget import kill_after_s, overran
from tuner.contract.errors import ArtifactFormatError, FxtuneError
from tuner.contract.exit_codes import ExitCode
from tuner.host import job_caches, warm_folder
from tuner.host.child_env import fxtune_python_path
from tuner.host.files import link_or_copy
from tuner.host.sandbox import (
    Limits,
    Sandbox,
    SandboxUnavailable,
    physical_memory_bytes,
    resolve_sandbox,
    run_child,
)

MEMORY_SHARE = 0.5  # of physical memory, as a worker's default (`worker_memory_fraction`)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # a child's text reaches a terminal


class SandboxRequired(FxtuneError):
    """No bubblewrap here, and the user did not choose to tune without it."""


class TuneStopped(FxtuneError):
    """The child ran past its budget and the margin, and was stopped."""


@dataclass(frozen=True)
class Request:
    """What the user asked `fxtune tune` for; `options` are the other arguments, passed on."""

    model: Path
    out: Path
    report: Path
    options: list[str]
    budget_s: float
    device: str = "cpu"
    world_size: int = 1
    cache: Path | None = None
    warm: bool = True  # seed the run's temp folder from this user's warm one (`warm_folder`)

    @property
    def on_gpu(self) -> bool:
        return not self.device.startswith("cpu")


def _ranked(path: Path | str, world_size: int) -> list[Path]:
    """Each rank's file of a `{rank}` pattern (a distributed run); the path itself for one."""
    if world_size == 1:
        return [Path(path)]
    return [Path(str(path).format(rank=r)) for r in range(world_size)]


def _model_in(folder: Path, world_size: int) -> str:
    """The program's name in the child's `in/` (a `{rank}` pattern for a distributed run)."""
    return str(folder / "in" / ("model.pt2" if world_size == 1 else "model_rank{rank}.pt2"))


def command(request: Request, folder: Path) -> list[str]:
    """The child's `fxtune tune`, on the private folder's files."""
    out = folder / "out"
    cmd = [sys.executable, "-m", "fxtune_cli", "tune", _model_in(folder, request.world_size)]
    cmd += ["--out", str(out / request.out.name), "--report", str(out / "report.json")]
    cmd += [*request.options, "--no-sandbox", "--progress-json"]
    if request.cache is not None:
        snapshot = job_caches.snapshot(request.cache, folder / "cache")
        cmd += ["--cache", str(snapshot), "--cache-out", str(out / job_caches.RECORDED)]
    return cmd


def _prepare(request: Request, folder: Path) -> None:
    (folder / "in").mkdir()
    (folder / "out").mkdir()
    places = _ranked(_model_in(folder, request.world_size), request.world_size)
    for path, place in zip(_ranked(request.model, request.world_size), places, strict=True):
        if not path.is_file():
            raise ArtifactFormatError(f"no such file: {path}")
        link_or_copy(path, place)


def _inside(folder: Path, rel: Any) -> Path | None:
    """The file `rel` (relative, as the report names it) within `folder`, or None."""
    if not isinstance(rel, str) or not rel:
        return None
    path = (folder / rel).resolve()
    return path if path.is_relative_to(folder.resolve()) and path.is_file() else None


def _deliver(request: Request, out: Path) -> dict[str, Any]:
    """Copy the outputs the child's report names to the user's places; the report, its paths
    rewritten for where it now lies."""
    report_path = out / "report.json"
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as exc:
        raise TuneStopped(f"the tuning child wrote no readable report ({exc})") from None
    names = _ranked(request.out.name, request.world_size)
    for name, target in zip(names, _ranked(request.out, request.world_size), strict=True):
        made = _inside(out, name.name)
        if made is None:
            raise TuneStopped(f"the tuning child wrote no {name}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made, target)
    artifacts = report.get("artifacts") if isinstance(report, dict) else None
    if isinstance(artifacts, dict):
        traces = artifacts.pop("traces", None)
        stem = request.out.name.removesuffix(".pt2")
        beside_out = Beside(request.out.parent, re.compile(rf"{re.escape(stem)}\.[\w.\-]+"))
        artifacts = _delivered(artifacts, out, request, beside_out)
        beside_report = Beside(request.report.parent, TRACE_NAMES)
        artifacts["traces"] = _delivered(traces, out, request, beside_report)
        report["artifacts"] = artifacts
    request.report.parent.mkdir(parents=True, exist_ok=True)
    request.report.write_text(json.dumps(report, indent=2))
    return report


TRACE_NAMES = re.compile(r"(baseline|tuned)\.trace\.json")


@dataclass(frozen=True)
class Beside:
    """Where files named in the report go, and the names they may have there (the child names
    them: no name may overwrite another of the user's files)."""

    folder: Path
    names: re.Pattern[str]


def _delivered(value: Any, out: Path, request: Request, beside: Beside) -> Any:
    """The artifacts' paths for where the files now are: each file the child made copied, by
    its name, next to the user's output (traces: the report), as `write_outputs` places them."""
    if isinstance(value, dict):
        return {k: _delivered(v, out, request, beside) for k, v in value.items()}
    made = _inside(out, value)
    if made is None or made.name == "report.json":
        return value
    if not beside.names.fullmatch(made.name) and made.name != request.out.name:
        return None  # not a name fxtune writes: not copied
    target = beside.folder / made.name
    if target != request.out:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(made, target)
    return os.path.relpath(target.resolve(), request.report.parent.resolve())


TABLE_TOP = "┏"  # the first line of the child's candidates table


def summary_of(stderr_text: str, keep: int = 20_000) -> str:
    """What the child printed for people, from its candidates table on: not what its libraries
    logged on the way (the profiler's USDT lines, ONNX's exporter)."""
    lines = stderr_text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(TABLE_TOP)]
    shown = lines[starts[-1] :] if starts else lines[-40:]
    return "\n".join(shown)[-keep:]


def readable(text: str) -> str:
    """A child's output as it may be shown on a terminal: no control characters."""
    return _CONTROL.sub("", text)


def tune_in_sandbox(request: Request, progress: Callable[[float, str], None]) -> str:
    """Run the tune in its sandbox; the child's summary (its stderr, made readable). Raises
    SandboxRequired where bubblewrap cannot run, TuneStopped past the budget, and the child's
    own error (as a FxtuneError carrying its exit code) when it fails."""
    try:
        kind = resolve_sandbox("bwrap")
    except SandboxUnavailable as exc:
        raise SandboxRequired(
            f"{exc}. `fxtune tune` compiles the program, which runs code generated from it: it "
            "does so in that sandbox, or, for a program you trust, with --no-sandbox"
        ) from None
    with tempfile.TemporaryDirectory(prefix="fxtune-tune-") as tmp:
        folder = Path(tmp)
        _prepare(request, folder)
        cmd = command(request, folder)
        read_only = (folder / "in", *([folder / "cache"] if request.cache else []))
        sandbox = Sandbox(kind, read_only=read_only, share_devices=request.on_gpu)
        memory = int(physical_memory_bytes() * MEMORY_SHARE)
        limits = Limits(kill_after_s(request.budget_s), address_space_bytes=memory)
        if sandbox.share_devices:  # CUDA reserves huge virtual ranges
            limits = Limits(limits.wall_s)
        if request.warm:
            warm_limits = Limits(warm_folder.WARM_TIMEOUT_S, address_space_bytes=memory)
            warm = warm_folder.machine_folder(Sandbox(kind), warm_limits, progress)
            if warm is not None:
                warm_folder.seed(warm, folder)
        env = {"PYTHONPATH": fxtune_python_path(os.environ.get("PYTHONPATH"))}
        result = run_child(cmd, limits.within(sandbox), folder, progress, env=env, sandbox=sandbox)
        summary = summary_of(readable((folder / "stderr.log").read_text(errors="replace")))
        if result.timed_out:
            raise TuneStopped(overran(request.budget_s))
        if not result.ok:
            raise ChildFailed(result.returncode, readable(result.error or ""))
        _deliver(request, folder / "out")
        if request.cache is not None:
            job_caches.merge_job(folder / "out", request.cache)
        return summary


class ChildFailed(FxtuneError):
    """The child exited with an error: its code and message are the command's."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message.removeprefix("error: ") or f"tuning failed (status {code})")
        self.code = code if code > 0 else ExitCode.INTERNAL  # killed by a signal
