"""What a tuning run leaves behind: the tuned program, the AOTInductor package or the runtime's
artifact, profiles, report."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from tuner.backends import registry as backends
from tuner.backends.isolation import compile_aoti_in_child
from tuner.backends.runtime_build import load_runner
from tuner.backends.runtime_files import check_artifact
from tuner.backends.runtimes import RUNTIMES, is_runtime
from tuner.contract.aoti_manifest import Expected, add_manifest
from tuner.contract.config import TunedConfig
from tuner.contract.device import Device
from tuner.contract.errors import FxtuneError
from tuner.graph.capture import example_inputs, save_program, to_program
from tuner.measure.equivalence import ReferenceOutputs
from tuner.measure.timing import quick_per_call_s
from tuner.tuning.modes import step_kind_for
from tuner.tuning.tuner import TuneOutcome, to_device


def aoti_path_for(program_path: Path) -> Path:
    """`tuned.pt2` -> `tuned.aoti.pt2`."""
    return program_path.with_name(program_path.name.removesuffix(".pt2") + ".aoti.pt2")


def write_outputs(
    outcome: TuneOutcome, out: Path, report: Path, *, profile: bool = True, progress: Any = None
) -> dict[str, Any]:
    say = progress or (lambda _f, _m: None)
    config = outcome.config
    device = Device.parse(config.hardware["device"])  # with its index: cuda:1 stays cuda:1
    replay = outcome.tuned  # the config replayed on the original, verified by the tuner
    inputs = tuple(to_device(x, device) for x in replay.inputs)
    stages: dict[str, float] = {}
    clock = time.monotonic()
    say(0.92, "exporting tuned program")
    if outcome.dispatch is not None:  # size buckets: one program, every bucket's graph in it
        save_program(outcome.dispatch, out)
    else:
        save_program(to_program(replay.gm, inputs), out)
    clock = _lap(stages, "export", clock)
    artifacts: dict[str, Any] = {"program": _rel(out, report), "aoti": None, "traces": {}}
    if outcome.buckets:
        _bucket_packages(outcome, out, report, artifacts, say)
    elif config.backend == "inductor":
        _package(outcome, out, report, artifacts, say)
    elif is_runtime(config.backend):
        _runtime_artifact(outcome, out, report, artifacts, say)
    _add_manifests(config, report, artifacts)
    clock = _lap(stages, "package", clock)
    profiles = _profiles(outcome, out, report, artifacts, say) if profile else {}
    _lap(stages, "profiles", clock)
    document = {
        "config": json.loads(config.to_json()),
        "profiles": profiles,
        "artifacts": artifacts,
        "samples": outcome.samples,
        "outputs_s": stages,
    }
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(json.dumps(document, indent=2))
    say(1.0, "done")
    return document


def _lap(stages: dict[str, float], name: str, since: float) -> float:
    """Records the seconds since `since` as step `name` of writing the outputs (the report's
    `outputs_s`: what a run spent after tuning, which its budget must cover); returns now."""
    now = time.monotonic()
    stages[name] = round(now - since, 2)
    return now


def _package(
    outcome: TuneOutcome, out: Path, report: Path, artifacts: dict[str, Any], say: Any
) -> None:
    """The chosen module's AOTInductor package (the one timed, when kept), shipped only when
    it answers as the original at every size tuned at."""
    say(0.94, "writing the AOTInductor package")
    device = Device.parse(outcome.config.hardware["device"])
    aoti = aoti_path_for(out)
    if outcome.package is not None:
        shutil.copyfile(outcome.package, aoti)
    else:
        settings = outcome.config.whole_model.settings
        backends.package_aoti(torch.export.load(out), aoti, settings=settings)
    original = outcome.original.module().to(device.torch_device)
    originals = tuple(to_device(x, device) for x in example_inputs(outcome.original))
    # The package is checked at every size tuned at, not only the example's.
    trials = [originals] + [
        tuple(to_device(x, device) for x in p.inputs) for p in outcome.points[1:]
    ]
    refused: list[str] = []
    if (error := _ships(aoti, original, trials, refused, outcome.tuned.pack)) is not None:
        artifacts["aoti"] = _rel(aoti, report)
        artifacts["aoti_max_abs_error"] = error
    else:
        artifacts["aoti_refused"] = "; ".join(refused)


def _add_manifests(config: TunedConfig, report: Path, artifacts: dict[str, Any]) -> None:
    """fxtune's manifest in every package shipped (`tuner.contract.aoti_manifest`): the service
    stores a package only with one that names this model and device."""
    expected = Expected(config.model_fingerprint, Device.parse(config.hardware["device"]).kind)
    listed = [artifacts.get("aoti"), *(b.get("aoti") for b in artifacts.get("buckets") or [])]
    for rel in {r for r in listed if r}:
        add_manifest(report.parent / rel, expected, str(config.hardware["torch"]))


def runtime_path_for(program_path: Path, runtime: str) -> Path:
    """`tuned.pt2` -> `tuned.onnx` (ONNX Runtime) or `tuned.openvino.zip` (OpenVINO)."""
    stem = program_path.name.removesuffix(".pt2")
    return program_path.with_name(stem + RUNTIMES[runtime].suffix)


def _runtime_artifact(
    outcome: TuneOutcome, out: Path, report: Path, artifacts: dict[str, Any], say: Any
) -> None:
    """The runtime's artifact that was timed, shipped only when it is data alone (`tuner.
    backends.runtime_files`) and answers as the original at every size tuned at; its digest
    goes into the config (`runtime.sha256`), which binds the config to these exact bytes."""
    config = outcome.config
    record = config.runtime
    if record is None:
        return
    say(0.94, f"writing the {config.backend} artifact")
    if outcome.package is None:
        record.reason = "the run kept no artifact of the chosen candidate"
        return
    path = runtime_path_for(out, config.backend)
    shutil.copyfile(outcome.package, path)
    device = Device.parse(config.hardware["device"])
    original = outcome.original.module().to(device.torch_device)
    trials = [tuple(to_device(x, device) for x in p.inputs) for p in outcome.points] or [
        tuple(to_device(x, device) for x in example_inputs(outcome.original))
    ]
    try:
        check_artifact(config.backend, path)
        runner = load_runner(
            config.backend, path, outcome.original.call_spec.out_spec, torch.get_num_threads()
        )
        pack = outcome.tuned.pack
        wrong, errors = ReferenceOutputs(original, trials).check_with_errors(
            lambda *a: runner(*pack(a))
        )
    except Exception as exc:  # refused as data, or it failed to load or run: it does not ship
        wrong, errors = f"{type(exc).__name__}: {exc}", None
    if wrong is not None or errors is None:
        path.unlink()
        record.reason = f"{path.name} refused: {wrong}"
        artifacts["runtime_refused"] = record.reason
        return
    record.sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    record.bytes = path.stat().st_size
    artifacts["runtime"] = _rel(path, report)
    artifacts["runtime_max_abs_error"] = errors.max_abs


def _profiles(
    outcome: TuneOutcome, out: Path, report: Path, artifacts: dict[str, Any], say: Any
) -> dict[str, Any]:
    """Profiles of the original and the tuned model, their traces written beside the report.

    What was timed as the original is what is profiled (a training step, for one: the step
    kind's), and the tuned runner as it was timed (`outcome.runner`)."""
    from tuner.profiling.profile import profile_callable

    say(0.97, "profiling baseline and tuned")
    config = outcome.config
    device = Device.parse(config.hardware["device"])
    original = outcome.original.module().to(device.torch_device)
    kind = step_kind_for(config.mode)
    base_mod = kind.profiled_baseline(original, config, device.torch_device)
    base_inputs = tuple(to_device(x, device) for x in example_inputs(outcome.original))
    tuned_inputs = tuple(to_device(x, device) for x in outcome.tuned.inputs)
    iterations = _profile_iterations(lambda: base_mod(*base_inputs))
    profiles: dict[str, Any] = {}
    notes: list[str] = []
    # When the original stands, "tuned" is the same program: profiled once, shown twice.
    unchanged = config.whole_model.name == "original"
    with _profiled_runner(outcome, out, notes) as tuned_runner:
        for name, fn in (
            ("baseline", lambda: base_mod(*base_inputs)),
            ("tuned", lambda: tuned_runner(*tuned_inputs)),
        ):
            if name == "tuned" and unchanged:
                profiles[name] = profiles["baseline"]
                artifacts["traces"][name] = artifacts["traces"]["baseline"]
                continue
            trace = report.parent / f"{name}.trace.json"
            profiles[name] = profile_callable(
                fn, device=device, iterations=iterations, trace_path=trace
            ).to_dict()
            artifacts["traces"][name] = _rel(trace, report)
    if is_runtime(config.backend) and not unchanged:
        notes.append(
            f"tuned profile: one {config.backend} call per iteration, whose kernels torch's "
            "profiler does not see (its time counts as overhead)"
        )
    if notes:
        tuned = dict(profiles["tuned"])
        tuned["missing"] = [*tuned.get("missing", []), *notes]
        profiles["tuned"] = tuned
    return profiles


def _bucket_packages(
    outcome: TuneOutcome, out: Path, report: Path, artifacts: dict[str, Any], say: Any
) -> None:
    """AOTInductor for size buckets. When every bucket chose inductor, `tuned.aoti.pt2` is one
    package compiled from the dispatching program (the `torch.cond` inside picks the bucket's
    kernels). When only some did, each of those ships the package that was timed for it, built
    for the whole range (it answers rightly and checks inputs over the whole range; the caller
    picks it by size, as `tuner.deploy.client` does with the config's buckets); compiling the eager
    buckets' graphs too would ship a combination that was never measured. Then
    `tuned.aoti.pt2` is the example size's bucket's package when that bucket chose inductor
    (as `backend` says), and absent otherwise. Each package is checked against the original at
    every size tuned at before it ships; one that differs is removed, with the reason."""
    device = Device.parse(outcome.config.hardware["device"])
    original = outcome.original.module().to(device.torch_device)
    trials = [tuple(to_device(x, device) for x in p.inputs) for p in outcome.points]
    every = all(b.bucket.backend == "inductor" for b in outcome.buckets)
    listed: list[dict[str, Any]] = [
        {"bucket": b.bucket.describe(), "name": b.bucket.name, "aoti": None}
        for b in outcome.buckets
    ]
    artifacts["buckets"] = listed
    refused: list[str] = []
    if every:
        say(0.94, "writing the AOTInductor package (every bucket)")
        aoti = aoti_path_for(out)
        backends.package_aoti(torch.export.load(out), aoti)
        if (error := _ships(aoti, original, trials, refused)) is not None:
            artifacts["aoti"] = _rel(aoti, report)
            artifacts["aoti_max_abs_error"] = error
            for entry in listed:
                entry["aoti"] = artifacts["aoti"]
    for k, b in enumerate(outcome.buckets):
        if every or b.bucket.backend != "inductor":
            continue
        headline = b.tuned is outcome.tuned
        stem = out.name.removesuffix(".pt2")
        path = aoti_path_for(out) if headline else out.with_name(f"{stem}.bucket{k}.aoti.pt2")
        if b.package is not None:
            shutil.copyfile(b.package, path)
        else:
            backends.package_aoti(b.tuned.to_program(), path)
        if (error := _ships(path, original, trials, refused)) is not None:
            listed[k]["aoti"] = _rel(path, report)
            if headline:
                artifacts["aoti"] = listed[k]["aoti"]
                artifacts["aoti_max_abs_error"] = error
    if refused:
        artifacts["aoti_refused"] = "; ".join(refused)


def _ships(
    path: Path,
    original: Any,
    trials: list[tuple[Any, ...]],
    refused: list[str],
    pack: Callable[[tuple[Any, ...]], tuple[Any, ...]] = tuple,
) -> float | None:
    """The package's largest absolute error when it answers as the original at every trial;
    None (and the package removed, the reason added to `refused`) when it does not.

    `pack` turns the original's inputs into the package's (a pass that repacks inputs).
    """
    loaded = backends.load_aoti(path)

    def packaged(*args: Any) -> Any:
        return loaded(*pack(args))

    wrong, errors = ReferenceOutputs(original, trials).check_with_errors(packaged)
    if wrong is None:
        return errors.max_abs
    path.unlink()
    refused.append(f"{path.name}: its outputs differ from the original's ({wrong})")
    return None


# Seconds of model calls per profile: enough iterations to average, few enough that profiling
# (and exporting its trace) stays a small part of a budgeted run.
PROFILE_S = 0.5


def _profile_iterations(fn: Callable[[], Any]) -> int:
    """Iterations for a profile: PROFILE_S of the original's calls, between 3 and 20."""
    return max(3, min(20, round(PROFILE_S / max(quick_per_call_s(fn, repeats=1), 1e-6))))


@contextmanager
def _profiled_runner(
    outcome: TuneOutcome, program_path: Path, notes: list[str]
) -> Iterator[Callable[..., Any]]:
    """What to profile for the tuned model: the runner itself, or for an AOTInductor package
    its instrumented twin (the same program compiled with kernel ranges, so the profile can
    attribute time to GEMMs, norms and embeddings; the shipped package has no ranges).

    The twin is compiled in a child within what is left of the tuning budget; when it does
    not fit (estimated or stopped), the shipped package is profiled and `notes` says why.
    """
    if outcome.config.backend != "inductor":
        yield outcome.runner
        return
    left = None if outcome.deadline is None else outcome.deadline - time.monotonic()
    estimate = outcome.twin_estimate_s
    if left is not None and (left <= 0 or (estimate is not None and estimate > left)):
        notes.append(
            "tuned profile: the package without kernel ranges (an instrumented twin, "
            f"estimated at {estimate or 0:.0f} s to compile, did not fit in the "
            f"{max(left, 0):.0f} s left of the budget), so its kernels count as overhead"
        )
        yield outcome.runner
        return
    with tempfile.TemporaryDirectory(prefix="fxtune-profile-") as tmp:
        try:
            twin = compile_aoti_in_child(
                program_path,
                Path(tmp) / "twin.aoti.pt2",
                timeout_s=left if left is not None else 3600.0,
                instrumented=True,
                settings=outcome.config.whole_model.settings,
            ).package
        except FxtuneError as exc:
            notes.append(f"tuned profile: the package without kernel ranges ({exc})")
            yield outcome.runner
            return
        yield backends.load_aoti(twin)  # takes the tuned program's inputs, as the runner does


def _rel(path: Path, report: Path) -> str:
    try:
        return str(path.resolve().relative_to(report.parent.resolve()))
    except ValueError:
        return str(path.resolve())
