"""Tuning results without tuning: what a tuner writes, for tests that exercise the queue."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

FINGERPRINT = "0123456789abcdef0123456789abcdef"
HARDWARE = {"device": "cpu", "name": "test cpu", "torch": "2.13.0", "threads": 1}


def config(fingerprint: str = FINGERPRINT, speedup: float = 1.5, **hardware: Any) -> dict[str, Any]:
    """A minimal tuned config that satisfies the contract's schema."""
    figures = {
        "name": "eager + tuned passes",
        "backend": "eager",
        "passes": [{"pass": "remove_dropout", "sites": ["s1"]}],
        "baseline_s": 0.003,
        "candidate_s": 0.002,
        "speedup": speedup,
        "ci": [speedup - 0.1, speedup + 0.1],
        "verdict": "faster",
    }
    site = {
        "pass": "remove_dropout",
        "site_id": "s1",
        "summary": "dropout on linear",
        "baseline_s": 1e-5,
        "candidate_s": 5e-6,
        "speedup": 2.0,
        "ci": [1.8, 2.2],
        "rounds": 10,
        "verdict": "faster",
        "accepted": True,
    }
    return {
        "schema_version": 1,
        "model_fingerprint": fingerprint,
        "hardware": {**HARDWARE, **hardware},
        "backend": "eager",
        "passes": figures["passes"],
        "sites": [site],
        "candidates": [figures],
        "whole_model": figures,
        "verification": {"inputs": 3, "max_abs_error": 0.0, "max_rel_error": 0.0, "passed": True},
        "tuning": {"budget_s": 1},
    }


def training_config(
    fingerprint: str = FINGERPRINT, speedup: float = 1.2, optimizer: str | None = "sgd"
) -> dict[str, Any]:
    """A training config (`fxtune tune --mode train`), as schema 3 writes it."""
    cfg = config(fingerprint, speedup)
    versus = {"candidate": "eager", "baseline_s": 0.004, "candidate_s": 0.003, "speedup": 1.3}
    return {
        **cfg,
        "passes": [],  # remove_dropout is no training pass: the service replays the config
        "schema_version": 3,
        "mode": "train",
        "training": {"optimizer": optimizer, "loss": "sum over floating outputs of their mean"},
        "tuning": {**cfg["tuning"], "versus_compile": {**versus, "ci": [1.2, 1.4]}},
    }


def program_fingerprint(program: Path) -> str:
    """What a real tuner reports for `program` (the service checks it; this needs torch)."""
    from tuner.graph.fingerprint import model_fingerprint
    from tuner.loading.load import load_program

    return model_fingerprint(load_program(program))


def write_result(out: Path, program: Path, cfg: dict[str, Any] | None = None) -> dict[str, Path]:
    """A tuner-shaped output folder (program + report + traces) and the parts to upload.

    Without `cfg`, the config names `program`'s own fingerprint, as a real tuner's does.
    """
    out.mkdir(parents=True, exist_ok=True)
    cfg = cfg or config(program_fingerprint(program))
    shutil.copy(program, out / "tuned.pt2")
    for kind in ("baseline", "tuned"):
        (out / f"{kind}.trace.json").write_text(json.dumps({"traceEvents": [], "kind": kind}))
    report = {
        "config": cfg,
        "profiles": {"baseline": {"ops_per_iter": 5.0}, "tuned": {"ops_per_iter": 4.0}},
        "artifacts": {
            "program": "tuned.pt2",
            "aoti": None,
            "traces": {"baseline": "baseline.trace.json", "tuned": "tuned.trace.json"},
        },
    }
    (out / "report.json").write_text(json.dumps(report))
    return {
        "report": out / "report.json",
        "program": out / "tuned.pt2",
        "trace_baseline": out / "baseline.trace.json",
        "trace_tuned": out / "tuned.trace.json",
    }


def upload_parts(files: dict[str, Path]) -> dict[str, tuple[str, bytes]]:
    return {name: (path.name, path.read_bytes()) for name, path in files.items()}


def fake_aoti_package(path: Path, fingerprint: str, device: str = "cpu") -> Path:
    """A package shaped as AOTInductor writes one, with fxtune's manifest for `fingerprint`
    (`tuner.contract.aoti_manifest`), and no real library in it: the service never loads one."""
    from tuner.contract.aoti_manifest import Expected, add_manifest

    model = "package/data/aotinductor/model"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("package/archive_format", "pt2")
        zf.writestr(f"{model}/w.wrapper.so", b"aoti")
        zf.writestr(f"{model}/w.wrapper_metadata.json", json.dumps({"AOTI_DEVICE_KEY": device}))
    add_manifest(path, Expected(fingerprint, device), "2.13.0")
    return path
