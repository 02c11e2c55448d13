"""Training-step tuning of each example: `python -m bench.train [--optimizer sgd] [--threads 1]`.

For each example exported in train mode (`examples.training`), a `--mode train` tuning run
with eager and torch.compile candidates; prints and writes (`bench/out/train-<optimizer>.json`,
`bench.record`)
every per-site decision (the site's forward + backward, rewritten over untouched), every
candidate's per-step speed ratio over the original's eager step and the shipped step's ratio
over torch.compile of the original's step, each with its 95% interval, all from interleaved
timing in one run. On a shared machine use `--threads 1`: two threads on two busy
cores stall each small kernel for a scheduler slice, and the step times then say more about
the load than about the step.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from bench import record
from examples.training import TRAINING, export_for_training
from tuner.measure.summary import format_interval
from tuner.tuning.tuner import TuneOptions, tune_program

OUT = Path(__file__).parent / "out"


def run(name: str, args: argparse.Namespace) -> dict[str, Any]:
    program = export_for_training(TRAINING[name]())
    options = TuneOptions(
        mode="train",
        optimizer=args.optimizer,
        backends=["eager", "compile"],
        budget_s=args.budget_s,
        whole_model_budget_s=args.candidate_s,
        threads=args.threads,
    )
    started = time.monotonic()
    config = tune_program(program, options).config
    return {
        "model": name,
        "optimizer": args.optimizer,
        "threads": args.threads,
        "seconds": round(time.monotonic() - started, 1),
        "chosen": config.whole_model.name,
        "verified": config.verification.passed,
        "sites": [
            {
                "pass": d.pass_name,
                "site": d.site_id,
                "summary": d.summary,
                "count": d.count,
                "verdict": d.verdict,
                "accepted": d.accepted,
                "speedup": d.speedup,
                "ci": d.ci,
                "original_ms": d.baseline_s and d.baseline_s * 1e3,
                "rewritten_ms": d.candidate_s and d.candidate_s * 1e3,
                "reason": d.reason,
            }
            for d in config.sites
        ],
        "candidates": [
            {
                "name": f.name,
                "verdict": f.verdict,
                "speedup": f.speedup,
                "ci": f.ci,
                "rounds": f.rounds,
                "original_ms": f.baseline_s and f.baseline_s * 1e3,
                "candidate_ms": f.candidate_s and f.candidate_s * 1e3,
                "reason": f.reason,
            }
            for f in config.candidates
        ],
        "versus_compile": config.tuning.get("versus_compile"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw", "none"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-s", type=float, default=600)
    parser.add_argument("--candidate-s", type=float, default=25, help="timing per candidate")
    parser.add_argument("--models", nargs="*", default=list(TRAINING))
    args = parser.parse_args()
    args.optimizer = None if args.optimizer == "none" else args.optimizer
    rows = [run(name, args) for name in args.models]
    record.write(f"train-{args.optimizer or 'none'}", rows)
    sites = Table("model", "site (forward + backward)", "x original", "95% interval", "verdict")
    for row in rows:
        for d in row["sites"]:
            speed = f"{d['speedup']:.2f}x" if d["speedup"] else "-"
            name = f"{d['pass']} {d['summary']}" + (f" (x{d['count']})" if d["count"] > 1 else "")
            sites.add_row(row["model"], name, speed, format_interval(d["ci"]), d["verdict"])
    Console().print(sites)
    table = Table("model", "candidate", "x eager step", "95% interval", "verdict")
    for row in rows:
        for c in row["candidates"]:
            speed = f"{c['speedup']:.2f}x" if c["speedup"] else "-"
            table.add_row(row["model"], c["name"], speed, format_interval(c["ci"]), c["verdict"])
        v = row["versus_compile"]
        if v and v.get("speedup"):
            shipped = f"{v['candidate']} x compile step"
            speed = f"{v['speedup']:.2f}x"
            table.add_row(row["model"], shipped, speed, format_interval(v.get("ci")), "")
        table.add_row(row["model"], f"chosen: {row['chosen']}", "", "", "")
    Console().print(table)


if __name__ == "__main__":
    main()
