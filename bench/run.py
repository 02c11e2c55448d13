"""`make bench`: each example model under eager, its peers, blind passes, and fxtune.

On CPU the peers are torch.compile and AOTInductor; on a CUDA GPU (`--device cuda`, the
default where one is present) also torch.compile's "reduce-overhead" (inductor with CUDA
graphs) and the original captured in one plain CUDA graph, timed with CUDA events (issue 11).

The examples are joined by two held-out models (bench.held_out: BERT and ViT from transformers
configs), so the "never below the best peer" column is checked on models nobody here wrote.

Each figure is a speed ratio over the original program run eagerly, from an interleaved A/B
comparison in this one run (tuner.measure.timing.compare: median of paired ratios, 95% interval).
Writes bench/out/results.json, results.md (the README table) and bench.png.
"""

from __future__ import annotations

import argparse
import copy
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from bench import dynamic
from bench.held_out import HELD_OUT, build_held_out
from examples.build import build_all
from tuner.backends import registry as backends
from tuner.backends.cuda_graphs import GraphedModule
from tuner.contract.device import CPU, Device
from tuner.graph.capture import example_inputs, on_device, to_graph_module
from tuner.loading.load import load_program
from tuner.measure.summary import format_interval
from tuner.measure.timing import compare
from tuner.passes import pass_names
from tuner.passes.apply import apply_steps
from tuner.tuning.outputs import aoti_path_for, write_outputs
from tuner.tuning.tuner import TuneOptions, tune_program

OUT = Path(__file__).parent / "out"
# What a user would pick instead of fxtune, per device kind; "fxtune / best peer" times fxtune
# against the faster of them directly (interleaved, in this run): above 1 means fxtune ships
# something faster.
PEERS: dict[str, tuple[str, ...]] = {
    "cpu": ("torch.compile", "AOTInductor"),
    "cuda": ("torch.compile", "reduce-overhead", "AOTInductor", "CUDA graph"),
}
OURS = ("every pass (eager)", "fxtune program (eager)", "fxtune")
console = Console()


def columns(device: Device) -> list[str]:
    return [*PEERS[device.kind], *OURS]


def ratio(
    base: Callable[[], Any], cand: Callable[[], Any], budget_s: float, device: Device = CPU
) -> dict[str, float]:
    s = compare(base, cand, budget_s=budget_s, device=device).summary
    return {"speedup": s.speedup, "ci_low": s.low, "ci_high": s.high, "rounds": s.rounds}


def built_now(module: Callable[..., Any], inputs: tuple[Any, ...]) -> Callable[..., Any]:
    """Compile (or capture) on the first call now: one inside a timed comparison would leave
    no rounds."""
    with torch.inference_mode():
        module(*inputs)
    return module


def peers(
    device: Device,
    program: Any,
    inputs: tuple[Any, ...],
    work: Path,
    name: str,
    names: Sequence[str] | None = None,
) -> dict[str, Callable[..., Any]]:
    """The original under each peer of `device` (or those of them in `names`: a quick check
    skips the slow ones), built and ready to time."""
    made: dict[str, Callable[[], Callable[..., Any]]] = {
        "torch.compile": lambda: torch.compile(program.module()),
        "reduce-overhead": lambda: torch.compile(program.module(), mode="reduce-overhead"),
        "AOTInductor": lambda: backends.load_aoti(
            backends.package_aoti(program, work / f"{name}.orig.aoti.pt2")
        ),
        "CUDA graph": lambda: GraphedModule(program.module()),
    }
    chosen = [p for p in PEERS[device.kind] if names is None or p in names]
    return {peer: built_now(made[peer](), inputs) for peer in chosen}


def _speed(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _cell(r: dict[str, Any]) -> str:
    return f"{_speed(r['speedup'])} {format_interval((r['ci_low'], r['ci_high']))}"


def bench_model(
    name: str,
    path: Path,
    work: Path,
    tune_budget_s: float,
    budget_s: float,
    device: Device = CPU,
) -> dict[str, Any]:
    program = load_program(path)
    if device.kind != "cpu":
        program = on_device(program, device.torch_device)
    inputs = example_inputs(program)
    eager = program.module()
    console.log(f"[{name}] building the peers: {', '.join(PEERS[device.kind])}")
    peer_runs = peers(device, program, inputs, work, name)
    blind = apply_steps(
        copy.deepcopy(to_graph_module(program)), inputs, [(p, None) for p in pass_names()]
    )
    blind_inputs = blind.pack(inputs)

    console.log(f"[{name}] tuning (budget {tune_budget_s:.0f} s)")
    started = time.monotonic()
    options = TuneOptions(
        budget_s=tune_budget_s,
        cache_path=work / "cache.json",
        workdir=work / f"{name}.work",
        device=device,
    )
    outcome = tune_program(program, options)
    tuned_path = work / f"{name}.tuned.pt2"
    write_outputs(outcome, tuned_path, work / f"{name}.report.json", profile=False)
    tuning_s = time.monotonic() - started
    config = outcome.config
    tuned_inputs = outcome.tuned.inputs
    tuned_program = torch.export.load(tuned_path).module()
    final = (
        backends.load_aoti(aoti_path_for(tuned_path))
        if config.backend == "inductor"
        else outcome.runner
    )

    console.log(f"[{name}] timing")
    variants: dict[str, Callable[[], Any]] = {
        **{peer: partial(run, *inputs) for peer, run in peer_runs.items()},
        "every pass (eager)": lambda: blind.gm(*blind_inputs),
        "fxtune program (eager)": lambda: tuned_program(*tuned_inputs),
        "fxtune": lambda: final(*tuned_inputs),
    }
    with torch.inference_mode():
        figures = {
            k: ratio(lambda: eager(*inputs), fn, budget_s, device) for k, fn in variants.items()
        }
        best = max(PEERS[device.kind], key=lambda k: figures[k]["speedup"] or 0.0)
        vs_peer = ratio(variants[best], variants["fxtune"], budget_s, device)
    return {
        "model": name,
        "device": str(device),
        "columns": columns(device),
        "ratios": figures,
        "best_peer": best,
        "vs_best_peer": vs_peer,
        "backend": config.backend,
        "chosen": config.whole_model.name,
        "tuning_s": round(tuning_s, 1),
        "timed_candidates": config.tuning["timed_candidates"],
        "cache_hits": config.tuning["cache_hits"],
        "accepted_sites": sum(1 for s in config.sites if s.accepted),
        "distinct_sites": len(config.sites),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    cols = rows[0]["columns"]
    head = ["model", *cols, "best peer", "fxtune / best peer", "fxtune backend", "tuning s"]
    head.append("timed candidates")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"]]
        cells += [_speed(r["ratios"][c]["speedup"]) for c in cols]
        cells += [r["best_peer"], _cell(r["vs_best_peer"])]
        cells += [r["backend"], f"{r['tuning_s']:.0f}", str(r["timed_candidates"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = rows[0]["columns"]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(cols)
    for i, col in enumerate(cols):
        xs = [j + i * width for j in range(len(rows))]
        ys = [r["ratios"][col]["speedup"] or 0.0 for r in rows]
        lo = [y - (r["ratios"][col]["ci_low"] or y) for y, r in zip(ys, rows, strict=True)]
        hi = [(r["ratios"][col]["ci_high"] or y) - y for y, r in zip(ys, rows, strict=True)]
        ax.bar(xs, ys, width, label=col, yerr=[lo, hi], capsize=2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["model"] for r in rows])
    ax.set_ylabel("speed over eager (x)")
    ax.set_title(f"fxtune on {where(Device.parse(rows[0]['device']))}, torch {torch.__version__}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def where(device: Device) -> str:
    if device.kind == "cuda":
        return torch.cuda.get_device_name(device.torch_device)
    return f"{torch.get_num_threads()} CPU threads"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu or cuda (default: cuda where a GPU is present)",
    )
    parser.add_argument("--models", nargs="*", default=None)
    parser.add_argument(
        "--held-out",
        nargs="*",
        default=list(HELD_OUT),
        help="transformers models built from configs (none: skip them)",
    )
    parser.add_argument("--tune-budget-s", type=float, default=120.0)
    parser.add_argument("--budget-s", type=float, default=6.0, help="per timed comparison")
    parser.add_argument(
        "--dynamic-batches",
        type=int,
        nargs="*",
        default=list(dynamic.BATCHES),
        help="batches to time the dynamic-batch model at (none: skip it)",
    )
    args = parser.parse_args()
    device = Device.parse(args.device).require_available()
    OUT.mkdir(exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = build_all(work, args.models) | build_held_out(work, args.held_out)
        for name, path in models.items():
            rows.append(bench_model(name, path, work, args.tune_budget_s, args.budget_s, device))
        dynamic_rows = (  # the dynamic-batch sweep is a CPU bench
            dynamic.bench_dynamic(
                work, args.tune_budget_s, ratio, args.budget_s, tuple(args.dynamic_batches)
            )
            if args.dynamic_batches and device.kind == "cpu"
            else []
        )
    cols = columns(device)
    table = Table("model", *cols, "best peer", "fxtune / best peer", "backend", "tuning s")
    table.add_column("timed")
    for r in rows:
        table.add_row(
            r["model"],
            *[_cell(r["ratios"][c]) for c in cols],
            r["best_peer"],
            _cell(r["vs_best_peer"]),
            r["backend"],
            f"{r['tuning_s']:.0f}",
            str(r["timed_candidates"]),
        )
    console.print(table)
    if dynamic_rows:
        console.print(dynamic.markdown(dynamic_rows))
    (OUT / "results.json").write_text(json.dumps(rows + dynamic_rows, indent=2))
    md = markdown(rows) + ("\n" + dynamic.markdown(dynamic_rows) if dynamic_rows else "")
    (OUT / "results.md").write_text(md)
    plot(rows, OUT / "bench.png")
    console.print(f"wrote {OUT / 'results.md'} and {OUT / 'bench.png'}")


if __name__ == "__main__":
    main()
