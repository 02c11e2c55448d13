"""The test suite's CUDA tests (`pytest -m cuda`) as one row of the check.

Only the test files that mark a test `cuda` are collected: the GPU host lacks the browser and
fuzzing stacks some other test modules import, and collecting them would fail the run for a
reason that has nothing to do with CUDA. Counts come from pytest's JUnit XML.
"""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bench.gpu_check.isolate import REPO, child_env, signal_status

MARK = "pytest.mark.cuda"


def cuda_test_files(root: Path = REPO / "tests") -> list[Path]:
    return sorted(p for p in root.rglob("test_*.py") if MARK in p.read_text(errors="replace"))


def _counts(junit: Path) -> dict[str, int]:
    suites = ET.parse(junit).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    if suite is None:
        return {}
    return {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}


def check_cuda_tests(work: Path, cuda: bool, timeout_s: float) -> dict[str, Any]:
    """`pytest -m cuda` on the files that have CUDA tests. On a GPU every one must pass (a skip
    there is a wrong skip); without one every one must skip."""
    files = cuda_test_files()
    junit, log = work / "cuda-tests.xml", work / "cuda-tests.log"
    # The suite's addopts need pytest-xdist and pytest-rerunfailures, which a GPU image lacks.
    cmd = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
           "-o", "addopts=-ra --strict-markers", f"--junitxml={junit}",
           *map(str, files)]  # fmt: skip
    row: dict[str, Any] = {"name": "pytest -m cuda", "kind": "check", "files": len(files)}
    started = time.monotonic()
    try:
        with log.open("w") as out:
            code = subprocess.run(
                cmd, cwd=REPO, env=child_env(), stdout=out, stderr=out, timeout=timeout_s
            ).returncode
    except subprocess.TimeoutExpired:
        code = None
    row["wall_s"] = round(time.monotonic() - started, 1)
    row["log"] = str(log)
    counts = _counts(junit) if junit.exists() else {}
    row.update(counts)
    passed = counts.get("tests", 0) - sum(
        counts.get(k, 0) for k in ("failures", "errors", "skipped")
    )
    row["passed"] = passed
    if code is None:
        row["status"] = f"timed out after {timeout_s:.0f} s"
    elif code < 0:
        row["status"] = signal_status(code)
    elif code != 0:
        row["status"] = f"failed: pytest exit {code} ({counts})"
    elif not counts.get("tests"):
        row["status"] = "failed: no CUDA test collected"
    elif cuda and counts.get("skipped"):
        row["status"] = f"failed: {counts['skipped']} CUDA test(s) skipped on a GPU"
    elif not cuda and passed:
        row["status"] = f"failed: {passed} CUDA test(s) ran without a GPU"
    else:
        row["status"] = "ok"
    return row
