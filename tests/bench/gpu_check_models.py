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


def aoti_segfaults() -> ModelSpec:
    """The dynamic MLP, in a process whose AOTInductor packages load as a segfault (as torch
    2.11's `aoti_load_package` did on the H200), without compiling one."""
    import ctypes

    from bench.gpu_check.models import REGISTRY
    from tuner.backends import registry

    def load(path: Path) -> object:
        ctypes.string_at(0)  # SIGSEGV
        raise AssertionError("unreachable")

    registry.package_aoti = lambda program, path, **_: path  # this process only
    registry.load_aoti = load
    return REGISTRY["mlp_dynamic"]
