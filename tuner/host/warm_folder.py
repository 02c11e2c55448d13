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
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tuner.host.child_env import fxtune_python_path
from tuner.host.sandbox import Limits, Sandbox, run_child

WARM_COMMAND = [sys.executable, "-m", "tuner.backends.warm_cache"]
WARM_TIMEOUT_S = 300.0
USER_ROOT = Path.home() / ".cache" / "fxtune" / "warm"
READY = "ready"  # written last: a folder without it is a build that did not finish


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


def _key() -> str:
    """What the headers were built for: a torch version (its headers) and a Python."""
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = "unknown"
    return f"torch-{torch_version}-py{sys.version_info.major}.{sys.version_info.minor}"


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
        return folder if (folder / READY).is_file() else None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
