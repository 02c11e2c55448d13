"""Each benchmark's current result: one JSON file per benchmark under bench/out/.

A run replaces its benchmark's file (older runs are git history), so the README's and the docs'
tables, generated from these files by `make tables` (`bench.tables`), always show the current
run. Each file says what it was measured on and from which code:

    {"benchmark": "zoo", "command": "python -m bench.zoo --budgets 60 300",
     "machine": {"cpu": ..., "cores": ..., "gpu": ..., "torch": ..., "python": ...},
     "recorded": {"date": "2026-11-27", "commit": "43ad8d0"},
     "rows": [...]}

A benchmark that reruns some of its rows (the zoo, one model at a time) merges them into the
current file by key, each row keeping its own `recorded`; rows from another machine or torch are
dropped rather than shown beside the new ones.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "out"
REPO = OUT.parents[1]
# What must agree for rows of two runs to share one table.
SAME_MACHINE = ("cpu", "cores", "gpu", "torch")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "gpu": gpu,
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def recorded() -> dict[str, str]:
    """Today's date and the checkout's commit (`+dirty` when tracked files differ from it)."""
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty=+dirty", "--abbrev=7"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {"date": datetime.date.today().isoformat(), "commit": commit}


def command() -> str:
    module = Path(sys.argv[0]).resolve()
    try:
        name = ".".join(module.relative_to(REPO).with_suffix("").parts)
    except ValueError:
        name = module.stem
    return " ".join(["python -m " + name, *sys.argv[1:]])


def path_of(benchmark: str) -> Path:
    return OUT / f"{benchmark}.json"


def read(benchmark: str, out: Path = OUT) -> dict[str, Any]:
    return json.loads((out / f"{benchmark}.json").read_text())


def write(benchmark: str, rows: list[dict[str, Any]], **extra: Any) -> Path:
    """Replace the benchmark's current file with this run."""
    doc = {
        "benchmark": benchmark,
        "command": command(),
        "machine": machine(),
        "recorded": recorded(),
        **extra,
        "rows": rows,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path = path_of(benchmark)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path


def merge(
    benchmark: str, rows: list[dict[str, Any]], key: Callable[[dict[str, Any]], Hashable]
) -> Path:
    """Write this run's rows over the current file's rows with the same key; each row keeps
    when and from which commit it was measured."""
    stamp = recorded()
    rows = [{**row, "recorded": stamp} for row in rows]
    here = machine()
    path = path_of(benchmark)
    kept: list[dict[str, Any]] = []
    if path.exists():
        current = json.loads(path.read_text())
        if all(current["machine"].get(k) == here.get(k) for k in SAME_MACHINE):
            new = {key(row) for row in rows}
            kept = [row for row in current["rows"] if key(row) not in new]
    doc = {
        "benchmark": benchmark,
        "command": command(),
        "machine": here,
        "recorded": stamp,
        "rows": kept + rows,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    return path
