"""The worker's warm temp folder (`tuner.host.warm_folder`): built once as the worker starts,
in a child sandboxed and limited as a job is, and copied into each job's folder before the job
starts. A job that starts before the build is done runs cold.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from pathlib import Path

from tuner.host import warm_folder
from tuner.host.sandbox import Limits, Sandbox

log = logging.getLogger("fxtune.worker")


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
        error = warm_folder.build(self.command, folder, limits, sandbox, self._stop.is_set)
        if error is None:
            self._ready.set()
            log.info("compile caches warmed for later jobs (%s)", folder)
        else:
            log.warning("warming the compile caches failed; jobs build cold: %s", error)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for the build to end; whether the folder is ready."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.ready

    def seed(self, workdir: Path) -> bool:
        """Copy the warm temp folder into `workdir` (as `workdir/tmp`) if it is ready."""
        if not self.ready or self._folder is None:
            return False
        warm_folder.seed(Path(self._folder.name), workdir)
        return True

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
