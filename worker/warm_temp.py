"""A temp folder warmed by one tiny AOTInductor build, copied into each job's folder.

Each job runs in a private folder of its own (`tuner.host.child_env.private_temp_env`), so
without this every job's first AOTInductor build made the precompiled headers and probed the
compiler again (about 19 s of a 2-core machine, `tuner.backends.warm_cache`): a third of a
60 s budget. The worker builds once, in a child sandboxed and limited as a job is, and copies
the folder that build left into each job's folder before the job starts. A copy, never a
link: a job may write into its temp folder, and nothing it writes may reach another job.
A job that starts before the build is done runs cold, as before.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from pathlib import Path

from tuner.host.sandbox import Limits, Sandbox, run_child

log = logging.getLogger("fxtune.worker")

WARM_TIMEOUT_S = 300.0


class WarmTemp:
    """Builds with `command` (its last argument: the package it writes, inside the folder) in a
    folder under `scratch` when started; `seed` copies the temp folder it left into a job's."""

    def __init__(self, command: list[str], scratch: Path | None) -> None:
        self.command = command
        self.scratch = scratch
        self._folder: tempfile.TemporaryDirectory[str] | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self, limits: Limits, sandbox: Sandbox) -> None:
        """Build in the background (once; an empty command builds nothing)."""
        if not self.command or self._thread is not None:
            return
        if self.scratch is not None:
            self.scratch.mkdir(parents=True, exist_ok=True)
        self._folder = tempfile.TemporaryDirectory(prefix="fxtune-warm-", dir=self.scratch)
        self._thread = threading.Thread(
            target=self._build, args=(Path(self._folder.name), limits, sandbox), daemon=True
        )
        self._thread.start()

    def _build(self, folder: Path, limits: Limits, sandbox: Sandbox) -> None:
        cmd = [*self.command, str(folder / "warm.pt2")]
        wall_s = min(limits.wall_s, WARM_TIMEOUT_S)
        limits = Limits(wall_s, address_space_bytes=limits.address_space_bytes)
        result = run_child(
            cmd, limits, folder, lambda _f, _m: None, cancelled=self._stop.is_set, sandbox=sandbox
        )
        if result.ok and (folder / "tmp").is_dir():
            self._ready.set()
            log.info("compile caches warmed for later jobs (%s)", folder)
        else:
            log.warning("warming the compile caches failed; jobs build cold: %s", result.error)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the build to end; whether the folder is ready."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.ready

    def seed(self, workdir: Path) -> bool:
        """Copy the warm temp folder into `workdir` (as `workdir/tmp`) if it is ready."""
        if not self.ready or self._folder is None:
            return False
        shutil.copytree(Path(self._folder.name) / "tmp", workdir / "tmp", dirs_exist_ok=True)
        return True

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
