"""The three routes from a program JSON to Python's compiler, and the resource bombs.

Each exploit is first shown to work against plain `torch.export.load(...).module()` (the
control: the marker file appears), then refused by fxtune's loader and by `fxtune sites` (exit
3) with no marker.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from tests.crafted import CODE_MARKER
from tuner.contract.errors import UnsafeArtifactError
from tuner.loading.load import load_program

ROUTES = {
    "expression_exec": "expr_str",
    "guard_exec": "guards_code",
    "name_exec": "parameter_name",
}
BOMBS = {
    "zeros_bomb": "makes a tensor of 4096.0 GiB",
    "matmul_chain": "FLOPs",
    "strided_weight": "zero or overlapping strides",
}


def _marker(hostile: dict[str, Path]) -> Path:
    return hostile["good"].parent / CODE_MARKER


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_plain_torch_runs_the_planted_code(hostile: dict[str, Path], name: str) -> None:
    """The control: each crafted file really is an exploit for torch's own loader."""
    marker = _marker(hostile)
    marker.unlink(missing_ok=True)
    try:
        module = torch.export.load(hostile[name]).module()
        batch = 4 if name != "name_exec" else 2  # name_exec is built from the static program
        with contextlib.suppress(AttributeError):  # name_exec's getattr fails after its exec
            module(torch.randn(batch, 16))
        assert marker.exists(), f"{name} did not run code under plain torch.export.load"
    finally:
        marker.unlink(missing_ok=True)


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_fxtune_refuses_each_route_before_torch_sees_it(
    hostile: dict[str, Path], name: str
) -> None:
    marker = _marker(hostile)
    marker.unlink(missing_ok=True)
    with pytest.raises(UnsafeArtifactError, match=ROUTES[name]):
        load_program(hostile[name])
    assert not marker.exists()


def _fxtune(*args: str) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run `fxtune ARGS`; also its wall time and its own peak resident memory (KiB).

    The peak is the process's VmHWM, written at exit: getrusage's ru_maxrss survives exec, so
    after subprocess's vfork it reported the (large) pytest parent's peak on CI.
    """
    with tempfile.TemporaryDirectory() as scratch:
        peak_file = Path(scratch) / "peak"
        code = (
            "import atexit\n"
            "def _peak():\n"
            "    status = open('/proc/self/status').read()\n"
            f"    open({str(peak_file)!r}, 'w').write(status.split('VmHWM:')[1].split()[0])\n"
            "atexit.register(_peak)\n"
            "from fxtune_cli import main\n"
            "main()\n"
        )
        cmd = [sys.executable, "-c", code, *args]
        start = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall_s = time.monotonic() - start
        peak_kb = int(peak_file.read_text())
    return done, wall_s, peak_kb


@pytest.mark.parametrize("name", sorted(ROUTES) + sorted(BOMBS))
def test_fxtune_sites_exits_3_with_the_reason(hostile: dict[str, Path], name: str) -> None:
    marker = _marker(hostile)
    marker.unlink(missing_ok=True)
    done, wall_s, peak_kb = _fxtune("sites", str(hostile[name]))
    assert done.returncode == 3, done.stderr
    assert "refused" in done.stderr
    why = ROUTES.get(name) or BOMBS[name]
    assert why in " ".join(done.stderr.split()), done.stderr
    assert not marker.exists()
    if name in BOMBS:  # the whole command, torch's import included
        assert wall_s < 30 and peak_kb < 1024**2, (wall_s, peak_kb)


def test_the_good_programs_still_load_and_list_sites(hostile: dict[str, Path]) -> None:
    """The refusals are specific: the untouched sources of every exploit pass."""
    for name, batch in (("good", 2), ("dynamic", 4), ("dynamic", 7)):
        program = load_program(hostile["good"].parent / f"{name}.pt2")
        assert program.module()(torch.randn(batch, 16)).shape == (batch, 16)
    done, _, _ = _fxtune("sites", str(hostile["good"]))
    assert done.returncode == 0, done.stderr
