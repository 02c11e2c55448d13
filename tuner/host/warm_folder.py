"""Compile caches warmed by one tiny AOTInductor build, copied into each sandboxed run's folder.

A sandboxed run (a worker's job, a sandboxed `fxtune tune`) has a private temp folder and
inductor cache (`tuner.host.child_env.private_temp_env`), so its first AOTInductor build made the
precompiled headers and probed the compiler again: about 19 s of a 2-core machine
(`tuner.backends.warm_cache`). On the zoo's dlrm at a 60 s budget, AOTInductor's build took 26-29 s
in a tune against 9.5 s warm, did not fit, and the original shipped. The folder that one tiny
build leaves is copied, never linked, into each run's folder: a run may write into its temp
folder, and nothing it writes may reach another run.

The worker builds its folder as it starts (`worker.warm_temp`); `fxtune tune` keeps one per user
and torch version (`machine_folder`), built in the sandbox the first time, before the budget's
clock starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tuner.host.child_env import fxtune_python_path
from tuner.host.sandbox import Limits, Sandbox, run_child

WARM_COMMAND = [sys.executable, "-m", "tuner.backends.warm_cache"]
WARM_TIMEOUT_S = 300.0
USER_ROOT = Path.home() / ".cache" / "fxtune" / "warm"
READY = "ready"  # written last: a folder without it is a build that did not finish
# Folders of other installations kept besides the one in use (about 290 MB each); of the rest, the
# least recently used go once unused for a day (a run may be copying one still).
KEPT_OTHERS = 3
UNUSED_S = 86400.0


def build(
    command: list[str],
    folder: Path,
    limits: Limits,
    sandbox: Sandbox,
    cancelled: Callable[[], bool] = lambda: False,
) -> str | None:
    """Run the warm-up build (`command` and the package path it writes) in `folder`, sandboxed
    and limited as a job is; None when its temp folder is ready, else why not."""
    cmd = [*command, str(folder / "warm.pt2")]
    limits = Limits(
        min(limits.wall_s, WARM_TIMEOUT_S), address_space_bytes=limits.address_space_bytes
    )
    env = {"PYTHONPATH": fxtune_python_path(os.environ.get("PYTHONPATH"))}
    result = run_child(
        cmd, limits, folder, lambda _f, _m: None, cancelled=cancelled, env=env, sandbox=sandbox
    )
    if result.ok and (folder / "tmp").is_dir():
        return None
    return result.error or f"the warm-up build exited with status {result.returncode}"


def seed(folder: Path, workdir: Path) -> None:
    """Copy the temp folder `folder`'s build left into `workdir` (as `workdir/tmp`)."""
    shutil.copytree(folder / "tmp", workdir / "tmp", dirs_exist_ok=True)


def _compiler() -> str:
    """The C++ compiler inductor calls (its default: CXX, else g++), as a path and its file's
    size and time: an upgraded compiler is a new file."""
    found = shutil.which(os.environ.get("CXX", "g++"))
    if found is None:
        return "none"
    path = Path(found).resolve()
    stat = path.stat()
    return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"


def _key() -> str:
    """What the headers were built for. inductor names a precompiled header by a digest of the
    header preprocessed, so the paths of torch's and Python's headers are in it: the same torch
    in another virtual environment (a worktree's, a fresh clone's) missed every header of a
    folder keyed by versions alone, and each run made them again (12 s of a 2-core machine; the
    zoo's AOTInductor builds took 23-31 s where 10-14 s were expected). So: the versions for
    reading, then a digest of torch's folder, Python's and the compiler."""
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "unknown"
    spec = importlib.util.find_spec("torch")
    torch_dir = str(Path(spec.origin).parent) if spec is not None and spec.origin else "none"
    where = "\n".join([torch_dir, sys.base_prefix, sys.prefix, _compiler()])
    digest = hashlib.sha256(where.encode()).hexdigest()[:12]
    return f"torch-{torch_version}-py{sys.version_info.major}.{sys.version_info.minor}-{digest}"


def machine_folder(
    sandbox: Sandbox,
    limits: Limits,
    say: Callable[[float, str], None],
    root: Path = USER_ROOT,
    command: list[str] = WARM_COMMAND,
) -> Path | None:
    """This user's warm folder for this torch, built now if there is none (None if that
    failed: the run then builds cold, as before). Built in a staging folder and renamed into
    place, so a run that starts meanwhile never sees half of one, and of two built at once
    one is kept."""
    folder = root / _key()
    if (folder / READY).is_file():
        with contextlib.suppress(OSError):
            os.utime(folder / READY)  # in use: the last to be pruned
        return folder
    say(0.0, "warming the compile caches once for this torch (a tiny AOTInductor build, about "
        "30 s on 2 cores, before the budget starts; later runs reuse them)")  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    try:
        error = build(command, staging, limits, sandbox)
        if error is not None:
            say(0.0, f"warming the compile caches failed; this run builds cold: {error}")
            return None
        (staging / READY).write_text("")
        if folder.exists() and not (folder / READY).is_file():  # one that did not finish
            shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # another run put its own in place first
            staging.rename(folder)
        prune(root, folder)
        return folder if (folder / READY).is_file() else None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def prune(root: Path, keep: Path, now: float | None = None) -> list[Path]:
    """Remove the least recently used warm folders of other installations beyond `KEPT_OTHERS`
    (only those unused for `UNUSED_S`); the removed ones."""
    now = time.time() if now is None else now
    others = []
    for path in root.iterdir():
        ready = path / READY
        if path != keep and path.is_dir() and not path.name.startswith(".") and ready.is_file():
            others.append((ready.stat().st_mtime, path))
    others.sort(reverse=True)
    removed = [p for used, p in others[KEPT_OTHERS:] if now - used > UNUSED_S]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed
