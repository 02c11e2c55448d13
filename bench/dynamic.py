"""`make bench`, dynamic part: one program with a dynamic batch, tuned once, timed per batch.

The MLP-with-split of issue 9 (exported with `Dim("batch", 2, 4096)`): fxtune tunes it at its
default sizes, then what it ships (the AOTInductor package when inductor won, else the tuned
module) and the tuned `.pt2` alone are timed against the original at each batch, interleaved
(tuner.measure.timing.compare), one row per batch.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from examples.dynamic import mlp_inputs, mlp_split
from tuner.backends import registry as backends
from tuner.loading.load import load_program
from tuner.measure.summary import format_interval
from tuner.tuning.outputs import aoti_path_for, write_outputs
from tuner.tuning.tuner import TuneOptions, tune_program

BATCHES = (2, 32, 512, 4096)
COLUMNS = ["fxtune program (eager)", "fxtune"]


def bench_dynamic(
    work: Path,
    tune_budget_s: float,
    ratio: Callable[[Callable[[], Any], Callable[[], Any], float], dict[str, float]],
    budget_s: float,
    batches: tuple[int, ...] = BATCHES,
) -> list[dict[str, Any]]:
    _, program = mlp_split()
    options = TuneOptions(
        budget_s=tune_budget_s, cache_path=work / "cache.json", workdir=work / "dynamic.work"
    )
    outcome = tune_program(program, options)
    tuned_path = work / "mlp_split_dynamic.tuned.pt2"
    write_outputs(outcome, tuned_path, work / "mlp_split_dynamic.report.json", profile=False)
    config = outcome.config
    eager = program.module()
    tuned_program = load_program(tuned_path).module()
    shipped = (
        backends.load_aoti(aoti_path_for(tuned_path))
        if config.backend == "inductor"
        else outcome.runner
    )
    rows = []
    for batch in batches:
        x = mlp_inputs(batch)
        with torch.inference_mode():
            figures = {
                "fxtune program (eager)": ratio(
                    lambda x=x: eager(*x), lambda x=x: tuned_program(*x), budget_s
                ),
                "fxtune": ratio(lambda x=x: eager(*x), lambda x=x: shipped(*x), budget_s),
            }
        rows.append(
            {
                "model": f"mlp_split dynamic (batch={batch})",
                "batch": batch,
                "ratios": figures,
                "backend": config.backend,
                "chosen": config.whole_model.name,
                "tuned_at": [p["label"] for p in config.tuning["sizes"]],
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    head = ["model", *COLUMNS, "fxtune backend", "tuned at"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"]]
        for c in COLUMNS:
            f = r["ratios"][c]
            cells.append(f"{f['speedup']:.2f}x {format_interval((f['ci_low'], f['ci_high']))}")
        cells += [r["backend"], ", ".join(r["tuned_at"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
