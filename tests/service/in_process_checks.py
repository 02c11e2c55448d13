"""The service's checks run in the test's own process, for tests of the API around them.

Every upload is checked by `tuner.checks.inspect` in a sandboxed child that imports torch:
about 5 s of CPU, most of it starting Python. Tests whose subject is the API (jobs, leases,
configs, the dashboard, worker authentication) upload programs the test built itself, so here
the same checks (`tuner.checks.inspect.main`: the fingerprint and resource bounds, a tuned
program's load, the verification against the original) run in this process, with the service's
own error mapping (`service.analysis.ProgramAnalysis`). Only the process and the sandbox around
them are left out; the tests of those run the real child (tests/service/test_hostile_uploads.py,
test_warm_uploads.py, test_warm_checkers.py, tests/tuner/checks, the end-to-end tests).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from service.analysis import Outcome, ProgramAnalysis, analysis_limits
from service.check_folder import CheckFolder
from service.check_gate import CheckGate, check_capacity
from service.core.config import Settings
from tuner.checks.inspect import main as inspect
from tuner.host.sandbox import ChildResult, error_line


class InProcessChecks(ProgramAnalysis):
    """`ProgramAnalysis` whose every check runs `tuner.checks.inspect` in this process."""

    def _run_cold(self, args: list[str], files: dict[str, Path]) -> Outcome:
        folder = CheckFolder(self.root, "check-")
        try:
            placed = folder.place(files)
            out = folder.path / "result.json"
            argv = [*(str(folder.path / placed[a]) if a in placed else a for a in args)]
            stderr = io.StringIO()
            with contextlib.redirect_stderr(stderr):
                code = inspect([*argv, "--out", str(out)])
            done = ChildResult(code, error_line(stderr.getvalue()))
            answer: dict[str, Any] | None = json.loads(out.read_text()) if done.ok else None
            return done, answer
        finally:
            folder.remove()


def in_process_checks(settings: Settings) -> ProgramAnalysis:
    """For `create_app(settings, checks=in_process_checks)`: no warm children; the service's
    own gate on how many checks run at once."""
    gate = CheckGate(check_capacity(settings))
    return InProcessChecks(settings.data_dir / "analysis", analysis_limits(settings), gate=gate)
