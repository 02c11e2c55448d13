"""Test-only entries for `bench.gpu_check`'s registry hook (`--model NAME=MODULE:ATTR`)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from bench.gpu_check.models import Built, ModelSpec


def _segfault(out_dir: Path) -> Built:
    """Dies the way native code dies: SIGSEGV to its own process, mid-row."""
    os.kill(os.getpid(), signal.SIGSEGV)
    raise AssertionError("unreachable: the process got SIGSEGV")


SEGFAULTING = ModelSpec("segfaulting", _segfault, budget_s=1)
