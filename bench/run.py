"""`make bench`: each example model under eager, its peers, blind passes, and fxtune.

On CPU the peers are torch.compile, AOTInductor and, where installed, OpenVINO and ONNX Runtime
(issue 48: the untouched program converted as a user would, LATENCY hint and f32 for OpenVINO,
every graph optimization for ONNX Runtime); on a CUDA GPU (`--device cuda`, the default where
one is present) torch.compile, its "reduce-overhead" (inductor with CUDA graphs), AOTInductor
and the original captured in one plain CUDA graph, timed with CUDA events (issue 11).

On CPU every comparison is timed in blocks of calls after a lead-in call
(`tuner.measure.timing.POOLED`): the runtimes' thread pools spin on after a call and would slow
whatever runs next. Each runtime is also timed against a second session of its own artifact
(`self_check`): 1.00x says the blocks keep one pool's leftovers off the other side.

The examples are joined by two held-out models (bench.held_out: BERT and ViT from transformers
configs), so the "never below the best peer" column is checked on models nobody here wrote.

What fxtune ships takes the original's inputs and packs them per call where a pass repacks them
(`combine_sparse_inputs`), as `load_tuned` runs it: on the recommendation example that packing
cost 8% of the call, which a caller who packs in its input pipeline saves.

Each figure is a speed ratio over the original program run eagerly, from an interleaved A/B
comparison in this one run (tuner.measure.timing.compare: median of paired ratios, 95% interval).
Writes bench/out/results.json (`bench.record`); `make tables` renders the README's table and the
docs' tables and plot from it.
"""

from __future__ import annotations

import argparse
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

from bench import dynamic, record, roofline
from bench.held_out import HELD_OUT, build_held_out
from examples.build import build_all
from tuner.backends import registry as backends
from tuner.backends.cuda_graphs import GraphedModule
from tuner.backends.runtime_build import load_runner
from tuner.backends.runtimes import installed_version, is_runtime
from tuner.contract.device import CPU, Device
from tuner.graph.capture import example_inputs, on_device, to_graph_module
from tuner.graph.copying import deep_copy
from tuner.loading.load import load_program
from tuner.measure.summary import format_interval
from tuner.measure.timing import POOLED, SINGLE, compare
from tuner.passes import pass_names
from tuner.passes.apply import apply_steps
from tuner.tuning.outputs import aoti_path_for, write_outputs
from tuner.tuning.tuner import TuneOptions, tune_program

OUT = Path(__file__).parent / "out"
# What a user would pick instead of fxtune, per device kind; "fxtune / best peer" times fxtune
# against the faster of them directly (interleaved, in this run): above 1 means fxtune ships
# something faster.
PEERS: dict[str, tuple[str, ...]] = {
    "cpu": ("torch.compile", "AOTInductor", "OpenVINO", "ONNX Runtime"),
    "cuda": ("torch.compile", "reduce-overhead", "AOTInductor", "CUDA graph"),
}
# The peers that are a runtime's artifact of the original, by the runtime's backend name.
RUNTIME_PEERS: dict[str, str] = {"OpenVINO": "openvino", "ONNX Runtime": "onnxruntime"}
OURS = ("every pass (eager)", "fxtune program (eager)", "fxtune")
console = Console()


def device_peers(device: Device) -> tuple[str, ...]:
    """The peers of `device` this machine can build (a runtime only where it is installed)."""
    return tuple(
        p
        for p in PEERS[device.kind]
        if p not in RUNTIME_PEERS or installed_version(RUNTIME_PEERS[p])
    )


def columns(device: Device) -> list[str]:
    return [*device_peers(device), *OURS]


def ratio(
    base: Callable[[], Any], cand: Callable[[], Any], budget_s: float, device: Device = CPU
) -> dict[str, float]:
    blocks = POOLED if device.kind == "cpu" else SINGLE
    s = compare(base, cand, budget_s=budget_s, device=device, blocks=blocks).summary
    return {
        "speedup": s.speedup,
        "ci_low": s.low,
        "ci_high": s.high,
        "rounds": s.rounds,
        "ms": None if s.candidate_s is None else round(s.candidate_s * 1e3, 4),
    }


def _runtime_peer(
    runtime: str, program: Any, inputs: tuple[Any, ...], work: Path, builds: dict[str, Any]
) -> Callable[..., Any]:
    """The original's artifact under `runtime`, as a user converts it; its build seconds and a
    second session of the same file (for the self-timing check) go into `builds`."""
    started = time.monotonic()
    built = backends.build(runtime, to_graph_module(program), inputs, work / runtime)
    builds[runtime] = {"build_s": round(time.monotonic() - started, 2)}
    assert built.package is not None
    twin = load_runner(runtime, built.package, program.call_spec.out_spec, torch.get_num_threads())
    builds[runtime]["twin"] = built_now(twin, inputs)
    return built.runner


def self_checks(
    builds: dict[str, Any],
    runs: dict[str, Callable[..., Any]],
    inputs: tuple[Any, ...],
    budget_s: float,
) -> dict[str, dict[str, float]]:
    """Each runtime peer against a second session of its own artifact: 1.00x expected."""
    out = {}
    for peer, runtime in RUNTIME_PEERS.items():
        if peer in runs and "twin" in builds.get(runtime, {}):
            twin = builds[runtime]["twin"]
            out[peer] = ratio(partial(runs[peer], *inputs), partial(twin, *inputs), budget_s)
    return out


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
    builds: dict[str, Any] | None = None,
) -> dict[str, Callable[..., Any]]:
    """The original under each peer of `device` (or those of them in `names`: a quick check
    skips the slow ones), built and ready to time; a runtime's build time and second session
    go into `builds`."""
    builds = {} if builds is None else builds
    made: dict[str, Callable[[], Callable[..., Any]]] = {
        "torch.compile": lambda: torch.compile(program.module()),
        "reduce-overhead": lambda: torch.compile(program.module(), mode="reduce-overhead"),
        "AOTInductor": lambda: backends.load_aoti(
            backends.package_aoti(program, work / f"{name}.orig.aoti.pt2")
        ),
        "CUDA graph": lambda: GraphedModule(program.module()),
        **{
            peer: partial(_runtime_peer, runtime, program, inputs, work, builds)
            for peer, runtime in RUNTIME_PEERS.items()
        },
    }
    chosen = [p for p in device_peers(device) if names is None or p in names]
    return {peer: built_now(made[peer](), inputs) for peer in chosen}


def shipped_runner(
    config: Any, tuned_path: Path, report: Path, runner: Callable[..., Any]
) -> Callable[..., Any]:
    """What a deployment runs: the AOTInductor package, the runtime's artifact, else the
    runner that was timed."""
    if config.backend == "inductor" and aoti_path_for(tuned_path).is_file():
        return backends.load_aoti(aoti_path_for(tuned_path))
    artifact = json.loads(report.read_text())["artifacts"].get("runtime")
    if is_runtime(config.backend) and artifact:
        program = torch.export.load(tuned_path)
        spec, threads = program.call_spec.out_spec, torch.get_num_threads()
        return load_runner(config.backend, report.parent / artifact, spec, threads)
    return runner


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
    console.log(f"[{name}] building the peers: {', '.join(device_peers(device))}")
    builds: dict[str, Any] = {}
    peer_runs = peers(device, program, inputs, work, name, builds=builds)
    blind = apply_steps(
        deep_copy(to_graph_module(program)), inputs, [(p, None) for p in pass_names()]
    )

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
    pack = outcome.tuned.pack
    tuned_program = torch.export.load(tuned_path).module()
    final = shipped_runner(config, tuned_path, work / f"{name}.report.json", outcome.runner)

    console.log(f"[{name}] timing")
    variants: dict[str, Callable[[], Any]] = {
        **{peer: partial(run, *inputs) for peer, run in peer_runs.items()},
        "every pass (eager)": lambda: blind.gm(*blind.pack(inputs)),
        "fxtune program (eager)": lambda: tuned_program(*pack(inputs)),
        "fxtune": lambda: final(*pack(inputs)),
    }
    with torch.inference_mode():
        figures = {
            k: ratio(lambda: eager(*inputs), fn, budget_s, device) for k, fn in variants.items()
        }
        best = max(device_peers(device), key=lambda k: figures[k]["speedup"] or 0.0)
        vs_peer = ratio(variants[best], variants["fxtune"], budget_s, device)
        checks = self_checks(builds, peer_runs, inputs, budget_s)
    return {
        "model": name,
        "device": str(device),
        "columns": columns(device),
        "ratios": figures,
        "best_peer": best,
        "vs_best_peer": vs_peer,
        "backend": config.backend,
        "chosen": config.whole_model.name,
        "chosen_build_s": config.whole_model.build_s,
        "peer_build_s": {runtime: b["build_s"] for runtime, b in builds.items()},
        "self_check": checks,
        "tuning_s": round(tuning_s, 1),
        "budget_s": tune_budget_s,
        "timed_candidates": config.tuning["timed_candidates"],
        "cache_hits": config.tuning["cache_hits"],
        "accepted_sites": sum(1 for s in config.sites if s.accepted),
        "distinct_sites": len(config.sites),
        **({"flops": roofline.program_flops(program)} if device.kind == "cpu" else {}),
    }


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
        peak = roofline.gemm_peak_flops() if device.kind == "cpu" else 0.0
        for name, path in models.items():
            rows.append(bench_model(name, path, work, args.tune_budget_s, args.budget_s, device))
        if peak:
            roofline.add_floors(rows, max(peak, roofline.gemm_peak_flops()))
        dynamic_rows = (  # the dynamic-batch sweep is a CPU bench
            dynamic.bench_dynamic(
                work, args.tune_budget_s, ratio, args.budget_s, tuple(args.dynamic_batches)
            )
            if args.dynamic_batches and device.kind == "cpu"
            else []
        )
    cols = columns(device)
    table = Table("model", *cols, "best peer", "fxtune / best peer", "fxtune chose", "build s")
    for head in ("tuning s / budget", "timed", "self-check"):
        table.add_column(head)
    for r in rows:
        build = r.get("chosen_build_s")
        table.add_row(
            r["model"],
            *[_cell(r["ratios"][c]) for c in cols],
            r["best_peer"],
            _cell(r["vs_best_peer"]),
            r["chosen"],
            "-" if build is None else f"{build:.1f}",
            f"{r['tuning_s']:.0f} / {r['budget_s']:.0f}",
            str(r["timed_candidates"]),
            ", ".join(f"{p} {_cell(c)}" for p, c in r.get("self_check", {}).items()),
        )
    console.print(table)
    if dynamic_rows:
        console.print(dynamic.markdown(dynamic_rows))
    path = record.write("results", rows + dynamic_rows)
    console.print(f"wrote {path} (`make tables` puts it in the README and the docs)")


if __name__ == "__main__":
    main()
