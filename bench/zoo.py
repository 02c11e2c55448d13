"""`make bench` on the model zoo (issue 19): fxtune as a user runs it, against the peers.

Per model (`bench.zoo_models`): export it, run `fxtune tune` as a user would (a fresh decision
cache per run, an inductor cache that has compiled nothing of the zoo's but, like that of any
machine that compiled before, holds inductor's compiler probes (`machine_cache`), default
options, profiles included) at each budget, and
record the command's wall time. The compile history (`compile_times.json`) is the machine's, as
a worker keeps it: the zoo's first model plans with the priors, the others with what the
earlier ones measured. Then, in this one process, time side by side against the
original run eagerly: torch.compile and AOTInductor of the original, and what fxtune shipped at
each budget, loaded from its output files as a deployment loads them. "fxtune / best peer" is a
direct interleaved comparison of the two (above 1: fxtune ships something faster).

`--load K` runs K busy single-threaded processes while `fxtune tune` runs, so the table can be
taken with other work on the cores as well as quiet. The peers are built and everything is timed
side by side with the busy processes stopped: the figures then say how fast what shipped is,
not how noisy the machine was. Writes bench/out/zoo.json and zoo.md.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from bench.run import built_now, peers, ratio
from bench.zoo_models import ZOO, exported
from tuner.backends import registry as backends
from tuner.contract.device import CPU
from tuner.graph.capture import example_inputs
from tuner.loading.load import load_program
from tuner.tuning.outputs import aoti_path_for

OUT = Path(__file__).parent / "out"
PEER_NAMES = ("torch.compile", "AOTInductor")
MARGIN_S = 15.0  # issue 19: a run ends within its budget plus this
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


MACHINE_CACHE = "machine.inductor"  # in the zoo's work folder, made once by `machine_cache`


def machine_cache(work: Path) -> Path:
    """An inductor cache that has built one tiny AOTInductor package, as any machine that has
    compiled before has: it holds the compiler probes inductor runs once per cache (6 g++ runs,
    about 7 s here), and the build leaves the precompiled headers in the temp folder's
    inductor folder (12 s). Each run starts from a copy, so a model's run pays no machine's
    first-compile costs and sees nothing compiled for another model."""
    folder = work / MACHINE_CACHE
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder)}
    cmd = [sys.executable, "-m", "tuner.backends.warm_cache", str(work / "warm-up.pt2")]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return folder


def tune_cli(path: Path, budget_s: float, work: Path) -> dict[str, Any]:
    """`fxtune tune` in a child, as a user runs it; its wall time and what it wrote."""
    stem = work / f"{path.stem}.{budget_s:g}s"
    cmd = [sys.executable, "-c", "from fxtune_cli import main; main()", "tune", str(path)]
    cmd += ["--out", f"{stem}.tuned.pt2", "--report", f"{stem}.report.json"]
    cmd += ["--budget-s", f"{budget_s:g}", "--cache", f"{stem}.cache.json"]
    inductor = work / f"{stem.name}.inductor"
    shutil.copytree(work / MACHINE_CACHE, inductor)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(inductor)}
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall_s = time.monotonic() - started
    if done.returncode != 0:
        return {"budget_s": budget_s, "wall_s": wall_s, "error": done.stderr[-2000:]}
    report = json.loads(Path(f"{stem}.report.json").read_text())
    config = report["config"]
    return {
        "budget_s": budget_s,
        "wall_s": round(wall_s, 1),
        "tuned": f"{stem}.tuned.pt2",
        "backend": config["backend"],
        "chosen": config["whole_model"]["name"],
        "aoti": report["artifacts"].get("aoti"),
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


def shipped(run: dict[str, Any]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """What fxtune shipped, loaded as a deployment runs it, and the inputs it takes."""
    tuned_path = Path(run["tuned"])
    program = load_program(tuned_path)
    inputs = example_inputs(program)
    if run["backend"] == "inductor" and run.get("aoti"):
        return backends.load_aoti(aoti_path_for(tuned_path)), inputs
    return backends.deployed(run["backend"], program.module()), inputs


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
    variants: dict[str, Callable[[], Any]] = {
        peer: partial(run, *inputs)
        for peer, run in peers(CPU, program, inputs, work, name, PEER_NAMES).items()
    }
    for run in runs:
        if "error" in run:
            continue
        runner, tuned_inputs = shipped(run)
        built_now(runner, tuned_inputs)
        variants[f"fxtune {run['budget_s']:g}s"] = partial(runner, *tuned_inputs)
    console.log(f"[{name}] timing")
    with torch.inference_mode():
        ratios = {k: ratio(lambda: eager(*inputs), fn, compare_s) for k, fn in variants.items()}
        best = max(PEER_NAMES, key=lambda k: ratios[k]["speedup"] or 0.0)
        for run in runs:
            key = f"fxtune {run['budget_s']:g}s"
            if key in variants:
                run["vs_best_peer"] = ratio(variants[best], variants[key], compare_s)
    return {"model": name, "ratios": ratios, "best_peer": best, "runs": runs}


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def markdown(rows: list[dict[str, Any]], budgets: list[float], load: int) -> str:
    head = ["model", *PEER_NAMES]
    for b in budgets:
        head += [f"fxtune {b:g}s", f"/ best peer ({b:g}s)", f"ships ({b:g}s)", f"wall s ({b:g}s)"]
        head += [f"sites timed/reused/noise ({b:g}s)"]
    lines = [
        f"<!-- {torch.__version__}, {torch.get_num_threads()} threads, {load} busy processes "
        "while tuning, none while timing -->",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for r in rows:
        cells = [r["model"], *(_x(r["ratios"][p]["speedup"]) for p in PEER_NAMES)]
        for run in r["runs"]:
            if "error" in run:
                cells += ["error", "-", "-", f"{run['wall_s']:.0f}", "-"]
                continue
            ours = r["ratios"].get(f"fxtune {run['budget_s']:g}s", {})
            vs = run.get("vs_best_peer", {})
            interval = f" [{vs['ci_low']:.2f}, {vs['ci_high']:.2f}]" if vs.get("ci_low") else ""
            counts = run.get("site_counts") or {}
            reused = counts.get("from_cache", 0) + counts.get("identical_copies", 0)
            cells += [
                _x(ours.get("speedup")),
                _x(vs.get("speedup")) + interval,
                run["chosen"],
                f"{run['wall_s']:.0f}",
                f"{counts.get('timed', 0)}/{reused}/{counts.get('below_noise', 0)}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    for b in budgets:
        vs = [
            run["vs_best_peer"]["speedup"]
            for r in rows
            for run in r["runs"]
            if run["budget_s"] == b and run.get("vs_best_peer", {}).get("speedup")
        ]
        walls = [run["wall_s"] for r in rows for run in r["runs"] if run["budget_s"] == b]
        within = sum(1 for w in walls if w <= b + MARGIN_S)
        if vs:
            geo = math.exp(sum(math.log(v) for v in vs) / len(vs))
            lines.append(f"\nAt {b:g} s: fxtune / best peer geomean {geo:.3f}x, min {min(vs):.2f}x")
        if walls:
            lines.append(
                f"At {b:g} s: wall time within budget + {MARGIN_S:g} s on {within} of "
                f"{len(walls)} runs, longest {max(walls):.0f} s"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="*", default=list(ZOO))
    parser.add_argument("--budgets", type=float, nargs="+", default=[60.0, 300.0])
    parser.add_argument("--compare-s", type=float, default=4.0, help="per timed comparison")
    parser.add_argument("--load", type=int, default=0, help="busy processes while tuning")
    parser.add_argument("--tag", default="", help="suffix for the output files")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        console.log("warming a machine-level inductor cache (compiler probes, headers)")
        machine_cache(Path(tmp))
        for name in args.models:
            rows.append(bench_model(name, args.budgets, Path(tmp), args.compare_s, args.load))
            stem = OUT / f"zoo{args.tag}"
            stem.with_suffix(".json").write_text(json.dumps(rows, indent=1))
            stem.with_suffix(".md").write_text(markdown(rows, args.budgets, args.load))
    console.print(markdown(rows, args.budgets, args.load))


if __name__ == "__main__":
    main()
