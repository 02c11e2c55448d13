"""One model's row, in its own process: build, `fxtune tune`, load what shipped, compare, time.

What ships is loaded from the files `fxtune tune` wrote, as a deployment loads them: the
AOTInductor package when one shipped, else the tuned `.pt2` under its backend
(`tuner.backends.registry.deployed`: a CUDA graph, torch.compile). It is compared with the original
on fresh inputs (`tuner.measure.equivalence.check_outputs`: the tuner's own tolerance;
`output_errors`: the largest error), then timed against eager and against each peer of the
device (`bench.run`'s peers, `tuner.measure.timing.compare`: interleaved, CUDA events on a GPU),
each pair once; AOTInductor is built and timed in a process of its own (`time_peer`). Kernel and op
counts come from the report's profiles, which `fxtune tune` already measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.gpu_check.isolate import REPO, Row, child_env, signal_status
from bench.gpu_check.models import Built, ModelSpec
from tuner.contract.device import Device
from tuner.measure.summary import format_interval


def tune(
    spec: ModelSpec, built: Built, work: Path, device: Device, budget_s: float
) -> dict[str, Any]:
    """`fxtune tune --device D` as a user runs it; its exit code, wall time and status."""
    cmd = [
        sys.executable, "-m", "fxtune_cli", "tune", str(built.path),
        "--device", str(device), "--budget-s", str(budget_s),
        "--out", str(work / "tuned.pt2"), "--report", str(work / "report.json"),
        "--cache", str(work / "decisions.json"), *spec.tune_args,
    ]  # fmt: skip
    log = work / "tune.log"
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(cmd, cwd=REPO, env=child_env(), stdout=out, stderr=out).returncode
    wall = round(time.monotonic() - started, 1)
    if code == 0:
        status = "ok"
    elif code < 0:
        status = signal_status(code) + " in fxtune tune"
    else:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        status = f"fxtune tune exit {code}: {(lines[-1] if lines else '')[:200]}"
    return {"rc": code, "wall_s": wall, "status": status, "log": str(log)}


def _profile_counts(report: dict[str, Any]) -> dict[str, Any]:
    """Kernels and ATen ops per iteration, baseline and tuned, from the report's profiles."""
    profiles = report.get("profiles") or {}
    counts: dict[str, Any] = {}
    for figure in ("kernels_per_iter", "ops_per_iter"):
        counts[figure] = {
            side: (profiles.get(side) or {}).get(figure) for side in ("baseline", "tuned")
        }
    return counts


def _figures(summary: dict[str, float]) -> dict[str, Any]:
    """`bench.run.ratio`'s figures and their cell text: "2.31x [2.20, 2.45]"."""
    speed = summary["speedup"]
    interval = format_interval((summary["ci_low"], summary["ci_high"]))
    return {**summary, "text": "-" if speed is None else f"{speed:.2f}x {interval}"}


def _status(
    mismatch: str | None, speedups: dict[str, Any], device: Device, failed: Sequence[str] = ()
) -> str:
    """ "ok" when the outputs match, every peer was built and, on a GPU, every comparison timed
    at least one round. A CPU dry run only exercises the harness: on a loaded CPU a 1 s
    comparison of a slow model can end before its first round, and that says nothing about
    fxtune."""
    if mismatch is not None:
        return "wrong outputs"
    if failed:
        return "peers not timed: " + "; ".join(failed)
    untimed = [k for k, f in speedups.items() if not f["rounds"]]
    if untimed and device.kind != "cpu":
        return f"no timing rounds against {', '.join(untimed)}"
    return "ok"


def check_model(job: dict[str, Any], spec: ModelSpec, row: Row) -> None:
    """Fill `row` for one model, stage by stage (see `bench.gpu_check.isolate`)."""
    from tuner.deploy.replay import apply_config
    from tuner.loading.load import load_program

    device = Device.parse(job["device"])
    work = Path(job["work"]) / spec.name
    work.mkdir(parents=True, exist_ok=True)
    budget_s = job.get("tune_budget_s") or spec.budget_s
    row.stage("building", model=spec.name, mode=spec.mode, device=str(device), budget_s=budget_s)
    built = spec.build(work)
    row.stage("tuning")
    outcome = tune(spec, built, work, device, budget_s)
    row.stage("tuned", tune=outcome)
    if outcome["rc"] != 0:
        row.data["status"] = outcome["status"]
        row.stage("done")
        return
    report = json.loads((work / "report.json").read_text())
    config = report["config"]
    row.stage(
        "loading what shipped",
        backend=config["backend"],
        chosen=config["whole_model"]["name"],
        verified=config["verification"]["passed"],
        **_profile_counts(report),
    )
    replay = apply_config(load_program(built.path), config)  # only for its input packing
    run = _check_train if spec.mode == "train" else _check_infer
    run(job, spec, built, work, device, report, replay.pack, row)


def _load_original(path: Path, device: Device) -> Any:
    from tuner.graph.capture import on_device
    from tuner.loading.load import load_program

    return on_device(load_program(path), device.torch_device)


def _tuned_module(work: Path, device: Device) -> torch.nn.Module:
    from tuner.graph.capture import on_device

    return on_device(torch.export.load(work / "tuned.pt2"), device.torch_device).module()


def _on(device: Device, trials: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    from tuner.tuning.tuner import to_device

    return [tuple(to_device(x, device) for x in t) for t in trials]


def _shipped_infer(
    work: Path, device: Device, report: dict[str, Any], notes: list[str]
) -> Callable[..., Any]:
    """What a deployment runs: the AOTInductor package when it shipped, else the tuned module
    under the chosen backend."""
    from tuner.backends import registry as backends

    config, artifacts = report["config"], report.get("artifacts") or {}
    if artifacts.get("aoti"):
        return backends.load_aoti(work / artifacts["aoti"])
    if artifacts.get("aoti_refused"):
        notes.append(f"AOTInductor package refused: {artifacts['aoti_refused']}")
    if config.get("buckets"):
        notes.append("size buckets: the dispatching .pt2 is timed under the example's backend")
    return backends.deployed(config["backend"], _tuned_module(work, device))


def _check_infer(
    job: dict[str, Any],
    spec: ModelSpec,
    built: Built,
    work: Path,
    device: Device,
    report: dict[str, Any],
    pack: Callable[[tuple[Any, ...]], tuple[Any, ...]],
    row: Row,
) -> None:
    from bench.run import PEERS, built_now, ratio
    from tuner.graph.capture import example_inputs
    from tuner.measure.equivalence import check_outputs, output_errors

    notes: list[str] = []
    original = _load_original(built.path, device)
    eager = original.module()
    shipped = _shipped_infer(work, device, report, notes)

    def call(*args: Any) -> Any:
        return shipped(*pack(args))

    row.stage("comparing outputs", notes=notes)
    trials = _on(device, built.trials)
    mismatch = check_outputs(eager, call, trials)
    abs_err, rel_err = output_errors(eager, call, trials)
    row.stage(
        "timing against eager",
        outputs="equal" if mismatch is None else f"differ: {mismatch}",
        max_abs_error=abs_err,
        max_rel_error=rel_err,
    )
    inputs = example_inputs(original)
    packed = pack(inputs)
    built_now(shipped, packed)
    ours = partial(shipped, *packed)
    with torch.inference_mode():
        speedups = {
            "eager": _figures(ratio(partial(eager, *inputs), ours, job["compare_s"], device))
        }
    failed: list[str] = []
    chosen = [p for p in PEERS[device.kind] if job.get("peers") is None or p in job["peers"]]
    for peer in sorted(chosen, key=BUILD_ORDER.index):  # the quick builds first
        row.stage(f"timing against {peer}", speedups=speedups)
        if peer in ISOLATED_PEERS:
            speedups[peer], why = _against_peer(job, spec, built, peer)
            if why:
                failed.append(f"{peer}: {why}")
            continue
        speedups[peer] = _timed_peer(job, spec, peer, original, ours)
    row.data["status"] = _status(mismatch, speedups, device, failed)
    row.stage("done", speedups=speedups)


def _against_peer(
    job: dict[str, Any], spec: ModelSpec, built: Built, peer: str
) -> tuple[dict[str, Any], str | None]:
    """What ships timed against one peer, in a process of its own: a peer whose build crashes
    (AOTInductor's package loader on a GPU image's own torch) costs its column, not the row.
    The figures, and why there are none."""
    from bench.gpu_check.isolate import run_isolated

    slug = "".join(c if c.isalnum() else "-" for c in peer.lower())
    peer_job = {**job, "kind": "peer", "name": f"{spec.name}.{slug}", "peer": peer,
                "built": str(built.path)}  # fmt: skip
    left = job.get("ends_at", time.time() + PEER_TIMEOUT_S) - time.time() - 5
    result = run_isolated(peer_job, Path(job["work"]) / spec.name, min(PEER_TIMEOUT_S, left))
    if result.get("status") == "ok":
        return result["speedup"], None
    why = str(result["status"])
    return {"speedup": None, "ci_low": None, "ci_high": None, "rounds": 0, "text": why[:60]}, why


PEER_TIMEOUT_S = 150.0
BUILD_ORDER = ("CUDA graph", "torch.compile", "reduce-overhead", "AOTInductor")
# Peers built and timed in a process of their own (`time_peer`): loading an AOTInductor package
# segfaulted in torch 2.11 on the H200 and took the row with it. The others are built in the
# row's process: a child costs 8-10 s there (Python, torch, a CUDA context), per peer and model.
ISOLATED_PEERS = ("AOTInductor",)


def time_peer(job: dict[str, Any], spec: ModelSpec, row: Row) -> None:
    """One peer's row (`_against_peer`): the peer built from the original, then timed against
    what shipped, interleaved in this process."""
    from bench.run import built_now
    from tuner.deploy.replay import apply_config
    from tuner.graph.capture import example_inputs
    from tuner.loading.load import load_program

    device = Device.parse(job["device"])
    work = Path(job["work"]) / spec.name
    built_path = Path(job["built"])
    report = json.loads((work / "report.json").read_text())
    pack = apply_config(load_program(built_path), report["config"]).pack
    original = _load_original(built_path, device)
    shipped = _shipped_infer(work, device, report, [])
    packed = pack(example_inputs(original))
    row.stage("building", peer=job["peer"])
    built_now(shipped, packed)
    figures = _timed_peer(job, spec, job["peer"], original, partial(shipped, *packed))
    row.data["status"] = "ok"
    row.stage("done", speedup=figures)


def _timed_peer(
    job: dict[str, Any], spec: ModelSpec, peer: str, original: Any, ours: Callable[[], Any]
) -> dict[str, Any]:
    """`peer` of the original, built now, then timed against `ours` (interleaved): its
    figures. In the row's process, or in one of its own (`time_peer`)."""
    from bench.run import peers, ratio
    from tuner.graph.capture import example_inputs

    device = Device.parse(job["device"])
    inputs = example_inputs(original)
    work = Path(job["work"]) / spec.name
    runner = peers(device, original, inputs, work, spec.name, names=[peer])[peer]
    with torch.inference_mode():
        return _figures(ratio(partial(runner, *inputs), ours, job["compare_s"], device))


def _check_train(
    job: dict[str, Any],
    spec: ModelSpec,
    built: Built,
    work: Path,
    device: Device,
    report: dict[str, Any],
    pack: Callable[[tuple[Any, ...]], tuple[Any, ...]],
    row: Row,
) -> None:
    """A training step: the shipped step (tuned .pt2 under eager or torch.compile) checked
    against the original's (outputs, loss, gradients, parameters after the step) and timed
    against the eager step and torch.compile's step, the training peer."""
    from bench.run import ratio
    from tuner.graph.capture import example_inputs
    from tuner.training.step import RUNNERS, check_training, compiled_runner, eager_runner

    config = report["config"]
    optimizer = (config.get("training") or {}).get("optimizer")
    original = _load_original(built.path, device)
    reference = original.module()
    make = RUNNERS.get(config["backend"], eager_runner)
    shipped = make(_tuned_module(work, device), optimizer, device.torch_device)
    row.stage("comparing outputs")
    trials = _on(device, built.trials)
    mismatch = check_training(reference, shipped, trials, optimizer, pack=pack)
    ref_runner = eager_runner(reference, optimizer, device.torch_device)
    abs_err = 0.0
    for trial in trials:
        ref, got = ref_runner.record(trial, seed=0), shipped.record(pack(trial), seed=0)
        pairs = [*zip(ref.outputs, got.outputs, strict=True), (ref.loss, got.loss)]
        pairs += [(g, got.grads.get(n)) for n, g in ref.grads.items() if g is not None]
        for e, g in pairs:
            if (
                isinstance(e, torch.Tensor)
                and isinstance(g, torch.Tensor)
                and e.is_floating_point()
            ):
                abs_err = max(abs_err, float((e.double() - g.double()).abs().max()))
    row.stage(
        "building the peers",
        outputs="equal" if mismatch is None else f"differ: {mismatch}",
        max_abs_error=abs_err,
    )
    inputs = example_inputs(original)
    packed = pack(inputs)
    compiled = compiled_runner(reference, optimizer, device.torch_device)
    compiled.step(*inputs)  # compile now, not inside a timed comparison
    shipped.step(*packed)
    row.stage("timing")
    ours = partial(shipped.step, *packed)
    eager_step = partial(ref_runner.step, *inputs)
    speedups = {"eager": _figures(ratio(eager_step, ours, job["compare_s"], device))}
    row.stage("timing", speedups=speedups)
    speedups["torch.compile"] = _figures(
        ratio(partial(compiled.step, *inputs), ours, job["compare_s"], device)
    )
    row.data["status"] = _status(mismatch, speedups, device)
    row.stage("done", speedups=speedups)
