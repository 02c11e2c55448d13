"""`make bench` on the model zoo (issue 19): fxtune as a user runs it, against the peers.

Per model (`bench.zoo_models`): export it, run `fxtune tune` as a user would (sandboxed, a fresh
decision cache per run, default options, profiles included) at each budget, and record the
command's wall time. Each run starts from the user's warm compile caches
(`tuner.host.warm_folder`: compiler probes and precompiled headers, nothing of any model), made
before the first model, as on any machine where `fxtune tune` ran before. The compile history
(`compile_times.json`) is the zoo run's, as a worker keeps its own: the first model plans with
the priors, the others with what the earlier ones measured. Then, in this one process, time side
by side against the original run eagerly: torch.compile, AOTInductor and (where installed)
OpenVINO and ONNX Runtime of the original, and what fxtune shipped at each budget, loaded from
its output files as a deployment loads them (a runtime's artifact under its runtime), in blocks
of calls (`bench.run.ratio`), each runtime also against a second session of itself
(`self_check`). "fxtune / best peer" is a direct interleaved comparison of the two (above 1:
fxtune ships something faster).

`--load K` runs K busy single-threaded processes while `fxtune tune` runs, so the table can be
taken with other work on the cores as well as quiet. The peers are built and everything is timed
side by side with the busy processes stopped: the figures then say how fast what shipped is,
not how noisy the machine was. Writes bench/out/zoo.json (zoo-load2.json with `--load 2`), one
row per model and budget, merged into the file's current rows (`bench.record`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from operator import itemgetter
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch.export import ExportedProgram

from bench import record
from bench.run import PEERS, built_now, device_peers, peers, ratio, self_checks
from bench.tables import zoo_table
from bench.zoo_models import ZOO, exported
from tuner.backends import registry as backends
from tuner.backends.runtime_build import load_runner
from tuner.backends.runtimes import is_runtime
from tuner.contract.device import CPU
from tuner.deploy.replay import apply_config
from tuner.graph.capture import example_inputs
from tuner.host import warm_folder
from tuner.host.sandbox import Limits, Sandbox, resolve_sandbox
from tuner.loading.load import load_program
from tuner.tuning.outputs import aoti_path_for

OUT = Path(__file__).parent / "out"
PEER_NAMES = device_peers(CPU)  # torch.compile, AOTInductor, and the runtimes installed here
PEERS_EVER = PEERS["cpu"]  # every CPU peer a row may hold
ZOO_KEY = itemgetter("model", "budget_s")  # a rerun replaces the row of that model and budget
console = Console()


def _busy() -> None:
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while True:
        a = (a @ a).tanh()


@contextmanager
def background_load(k: int) -> Iterator[None]:
    """K processes each keeping one core busy, stopped on exit."""
    procs = [mp.get_context("spawn").Process(target=_busy, daemon=True) for _ in range(k)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.join()


def warm_caches() -> None:
    """The user's warm compile caches, made now if there are none (`fxtune tune` would make
    them before its first run's budget starts)."""
    sandbox = Sandbox(resolve_sandbox("bwrap"))
    limits = Limits(warm_folder.WARM_TIMEOUT_S)
    folder = warm_folder.machine_folder(sandbox, limits, lambda _f, m: console.log(m))
    console.log(f"warm compile caches: {folder or 'none (runs build cold)'}")


def tune_cli(path: Path, budget_s: float, work: Path) -> dict[str, Any]:
    """`fxtune tune` in a child, as a user runs it; its wall time and what it wrote."""
    stem = work / f"{path.stem}.{budget_s:g}s"
    cmd = [sys.executable, "-c", "from fxtune_cli import main; main()", "tune", str(path)]
    cmd += ["--out", f"{stem}.tuned.pt2", "--report", f"{stem}.report.json"]
    cmd += ["--budget-s", f"{budget_s:g}", "--cache", f"{stem}.cache.json"]
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall_s = time.monotonic() - started
    if done.returncode != 0:
        return {"budget_s": budget_s, "wall_s": wall_s, "error": done.stderr[-2000:]}
    report = json.loads(Path(f"{stem}.report.json").read_text())
    config = report["config"]
    return {
        "budget_s": budget_s,
        "wall_s": round(wall_s, 1),
        "tuned": f"{stem}.tuned.pt2",
        "report": f"{stem}.report.json",
        "backend": config["backend"],
        "chosen": config["whole_model"]["name"],
        "build_s": config["whole_model"].get("build_s"),
        "aoti": report["artifacts"].get("aoti"),
        "runtime": report["artifacts"].get("runtime"),
        "tuning_s": config["tuning"].get("seconds"),
        "outputs_s": report.get("outputs_s"),
        "site_counts": config["tuning"].get("site_counts"),
        "load": config["tuning"].get("load"),
        "peers_note": config["tuning"].get("peers"),
        "candidates": {
            f["name"]: {
                "verdict": f["verdict"],
                "speedup": f.get("speedup"),
                "why": f.get("reason"),
            }
            for f in config["candidates"]
        },
    }


def shipped(run: dict[str, Any], original: ExportedProgram) -> Callable[..., Any]:
    """What fxtune shipped, loaded as a deployment runs it: it takes the original's inputs and
    packs them on every call where a pass repacks them, as `load_tuned` does."""
    tuned_path = Path(run["tuned"])
    program = load_program(tuned_path)
    if run["backend"] == "inductor" and run.get("aoti"):
        runner = backends.load_aoti(aoti_path_for(tuned_path))
    elif is_runtime(run["backend"]) and run.get("runtime"):
        artifact = tuned_path.parent / run["runtime"]
        spec, threads = program.call_spec.out_spec, torch.get_num_threads()
        runner = load_runner(run["backend"], artifact, spec, threads)
    else:
        runner = backends.deployed(run["backend"], program.module())
    config = json.loads(Path(run["report"]).read_text())["config"]
    if not config.get("changes_inputs"):
        return runner
    pack = apply_config(original, config).pack
    return lambda *inputs: runner(*pack(inputs))


def bench_model(
    name: str, budgets: list[float], work: Path, compare_s: float, load: int
) -> dict[str, Any]:
    path = work / f"{name}.pt2"
    torch.export.save(exported(name), path)
    runs = []
    for budget in budgets:
        console.log(
            f"[{name}] fxtune tune --budget-s {budget:g}" + (f" beside {load} busy" if load else "")
        )
        with background_load(load):
            runs.append(tune_cli(path, budget, work))
        console.log(f"[{name}]   {runs[-1].get('chosen')} in {runs[-1]['wall_s']:.0f} s")
    program = load_program(path)
    inputs = example_inputs(program)
    eager = program.module()
    console.log(f"[{name}] building the peers")
    builds: dict[str, Any] = {}
    peer_runs = peers(CPU, program, inputs, work, name, PEER_NAMES, builds)
    variants: dict[str, Callable[[], Any]] = {
        peer: partial(run, *inputs) for peer, run in peer_runs.items()
    }
    for run in runs:
        if "error" in run:
            continue
        runner = built_now(shipped(run, program), inputs)
        variants[f"fxtune {run['budget_s']:g}s"] = partial(runner, *inputs)
    console.log(f"[{name}] timing")
    with torch.inference_mode():
        ratios = {k: ratio(lambda: eager(*inputs), fn, compare_s) for k, fn in variants.items()}
        best = max(PEER_NAMES, key=lambda k: ratios[k]["speedup"] or 0.0)
        for run in runs:
            key = f"fxtune {run['budget_s']:g}s"
            if key in variants:
                run["vs_best_peer"] = ratio(variants[best], variants[key], compare_s)
        checks = self_checks(builds, peer_runs, inputs, compare_s)
    return {
        "model": name,
        "ratios": ratios,
        "best_peer": best,
        "runs": runs,
        "peer_build_s": {runtime: b["build_s"] for runtime, b in builds.items()},
        "self_check": checks,
    }


def budget_rows(row: dict[str, Any], load: int) -> list[dict[str, Any]]:
    """`bench_model`'s row as one row per budget, as bench/out/zoo.json keeps them: a rerun of
    one model at one budget replaces just that row (`bench.record.merge`)."""
    out = []
    for run in row["runs"]:
        ours = row["ratios"].get(f"fxtune {run['budget_s']:g}s")
        ratios = {p: r for p, r in row["ratios"].items() if p in PEERS_EVER} | {"fxtune": ours}
        out.append(
            {
                "model": row["model"],
                "budget_s": run["budget_s"],
                "load": load,
                "ratios": ratios,
                "best_peer": row["best_peer"],
                "run": run,
                "peer_build_s": row.get("peer_build_s", {}),
                "self_check": row.get("self_check", {}),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=list(ZOO))
    parser.add_argument("--budgets", type=float, nargs="+", default=[60.0, 300.0])
    parser.add_argument("--compare-s", type=float, default=4.0, help="per timed comparison")
    parser.add_argument("--load", type=int, default=0, help="busy processes while tuning")
    args = parser.parse_args()
    name = f"zoo-load{args.load}" if args.load else "zoo"
    rows: list[dict[str, Any]] = []
    path = record.path_of(name)
    with tempfile.TemporaryDirectory() as tmp:
        warm_caches()
        for model in args.models:
            row = bench_model(model, args.budgets, Path(tmp), args.compare_s, args.load)
            rows += budget_rows(row, args.load)
            path = record.merge(name, budget_rows(row, args.load), ZOO_KEY)
    for budget in args.budgets:
        console.print(zoo_table(rows, budget))
    console.print(f"wrote {path} (`make tables` puts it in the README and the docs)")


if __name__ == "__main__":
    main()
