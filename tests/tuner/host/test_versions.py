"""`fxtune --version`'s facts come from distribution metadata, without importing anything."""

from __future__ import annotations

import subprocess
import sys

from tuner.backends.runtimes import RUNTIMES
from tuner.host.versions import OPTIONAL_RUNTIMES


def test_the_runtimes_are_the_ones_the_backends_run() -> None:
    assert {name: RUNTIMES[name].distributions for name in RUNTIMES} == OPTIONAL_RUNTIMES
    assert {RUNTIMES[name].module for name in RUNTIMES} == set(OPTIONAL_RUNTIMES)


def test_version_lines_import_neither_torch_nor_a_runtime() -> None:
    code = (
        "import sys; from tuner.host.versions import version_lines; version_lines(); "
        "print(sorted({'torch', 'openvino', 'onnxruntime'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
