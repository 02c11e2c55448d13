"""The deployment client: pick up the tuned config for a model, or run it untuned.

Importable with the tuner and httpx alone (no service dependencies). A deployment must never
fail because of fxtune: every failure (server down, timeout, no config yet, the model changed so
its fingerprint has no config, a config this client cannot use) ends in the untuned module and
exactly one clear `FxtuneClientWarning`.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import tempfile
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import httpx
import torch
from pydantic import ValidationError
from torch import nn
from torch.export import ExportedProgram

from tuner.backends.registry import DEPLOYED, deployed
from tuner.backends.runtimes import RUNTIMES, installed_version, is_runtime
from tuner.contract.config import (
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    Bucket,
    Mode,
    PassStep,
    TunedConfig,
)
from tuner.contract.device import Device
from tuner.deploy.replay import apply_buckets, apply_config, replay_steps
from tuner.graph.fingerprint import model_fingerprint
from tuner.graph.shapes import ShapeMismatch, ShapeSpec, spec_of
from tuner.host.hardware import describe
from tuner.passes.apply import Transformed

log = logging.getLogger(__name__)

DEFAULT_CACHE = Path.home() / ".cache" / "fxtune" / "configs"


class FxtuneClientWarning(UserWarning):
    """Tuning could not be used (the module runs untuned), or only from the local cache."""


class PackedInputs(nn.Module):
    """Keeps the original call signature when a tuned program takes packed inputs."""

    def __init__(self, tuned: Transformed) -> None:
        super().__init__()
        self.tuned = tuned.gm
        self._transformed = tuned

    def forward(self, *args: Any) -> Any:
        return self.tuned(*self._transformed.pack(tuple(args)))


class CheckedInputs(nn.Module):
    """Runs the tuned module only on inputs of the shapes its program was built for.

    The tuned module is a replay of the config on an unlifted graph without export's guard
    check: a static program's views would read other sizes wrongly. Inputs outside the
    program's shapes (another static size, a dynamic size out of range) run the untuned module
    instead, with one FxtuneClientWarning per module; the untuned one raises its own error for
    inputs it cannot serve either.
    """

    def __init__(self, tuned: nn.Module, spec: ShapeSpec, untuned: Callable[[], nn.Module]) -> None:
        super().__init__()
        self.tuned = tuned
        self.spec = spec
        self._make_untuned = untuned
        self._untuned: nn.Module | None = None
        self.warned = False

    def forward(self, *args: Any) -> Any:
        try:
            self.spec.check(args)
        except ShapeMismatch as exc:
            if not self.warned:
                self.warned = True
                warnings.warn(
                    f"fxtune: running the model untuned for these inputs: {exc}",
                    FxtuneClientWarning,
                    stacklevel=2,
                )
            if self._untuned is None:
                self._untuned = self._make_untuned()
            return self._untuned(*args)
        return self.tuned(*args)


def checked_config(raw: Any, fingerprint: str) -> TunedConfig:
    """The config, or ValueError saying why it must not be applied to this model."""
    try:
        config = TunedConfig.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "config"
        raise ValueError(f"malformed config ({where}: {first['msg']})") from None
    if config.schema_version not in READABLE_VERSIONS:
        raise ValueError(
            f"config schema version {config.schema_version} is not one this fxtune reads "
            f"({', '.join(map(str, READABLE_VERSIONS))}; it writes {SCHEMA_VERSION})"
        )
    if config.model_fingerprint != fingerprint:
        raise ValueError(
            f"the config is for fingerprint {config.model_fingerprint}, not {fingerprint}"
        )
    return config


class ConfigCache:
    """Config JSON plus its ETag on disk, per fingerprint and device.

    An entry that cannot be read or no longer validates counts as absent, so a damaged cache
    never stops the next fetch; a cache that cannot be written only costs that fetch its 304.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, fingerprint: str, kind: str) -> Path:
        return self.root / f"{fingerprint}-{kind}.json"

    def load(self, fingerprint: str, kind: str) -> tuple[str | None, dict[str, Any] | None]:
        path = self._path(fingerprint, kind)
        try:
            doc = json.loads(path.read_text())
            config = doc["config"]
            checked_config(config, fingerprint)
            return doc["etag"], config
        except FileNotFoundError:
            return None, None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.info("fxtune: ignoring the cached config %s: %s", path, exc)
            return None, None

    def save(self, fingerprint: str, kind: str, etag: str | None, config: dict) -> None:
        path = self._path(fingerprint, kind)
        tmp: str | None = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump({"etag": etag, "config": config}, f)
            os.replace(tmp, path)
        except OSError as exc:
            log.info("fxtune: could not cache the config in %s: %s", self.root, exc)
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def forget(self, fingerprint: str, kind: str) -> None:
        with contextlib.suppress(OSError):
            self._path(fingerprint, kind).unlink(missing_ok=True)


MAX_CONFIG_BYTES = 8 * 1024 * 1024  # configs are tens of KB; a reply past this is not one


class ReplyTooLarge(Exception):
    """The server's reply passed the cap (declared, or counted while streaming)."""


def _get(
    url: str,
    params: dict[str, str],
    headers: dict[str, str],
    timeout: float,
    max_bytes: int = MAX_CONFIG_BYTES,
) -> httpx.Response:
    """GET with `timeout` bounding the whole exchange, not each socket read: a server that
    trickles bytes would otherwise hold a deployment's start-up for as long as it likes. The
    request runs in a daemon thread that is abandoned (and ends on its own) when late. The body
    is streamed and reading stops past `max_bytes` (ReplyTooLarge): a reply of any size would
    otherwise be held whole in the deployment's memory."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            with (
                httpx.Client(timeout=timeout) as client,
                client.stream("GET", url, params=params, headers=headers) as response,
            ):
                result["response"] = _capped(response, max_bytes)
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, name="fxtune-config-fetch", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise httpx.TimeoutException(f"no complete answer within {timeout:g} s")
    if "error" in result:
        raise result["error"]
    return result["response"]


def _capped(response: httpx.Response, max_bytes: int) -> httpx.Response:
    """The streamed response read into memory, if it fits (decoded bytes are counted, so a
    compressed bomb stops at the cap too)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise ReplyTooLarge(f"it declares {int(declared)} bytes")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise ReplyTooLarge(f"more than {max_bytes} bytes came")
    headers = [(k, v) for k, v in response.headers.items() if k.lower() != "content-encoding"]
    return httpx.Response(
        response.status_code, headers=headers, content=bytes(body), request=response.request
    )


def _detail(response: httpx.Response) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        detail = response.json().get("detail")
        if isinstance(detail, str):
            return f": {detail}"
    return ""


def _or_cached(cached: dict[str, Any] | None, reason: str) -> tuple[dict[str, Any] | None, str]:
    return (cached, f"cache: {reason}") if cached is not None else (None, reason)


def fetch_config(
    fingerprint: str,
    *,
    server: str,
    device: Device | str = "cpu",
    cache_dir: Path | None = None,
    timeout: float = 5.0,
    token: str | None = None,
    use_cache: bool = True,
    mode: Mode = "infer",
    max_bytes: int = MAX_CONFIG_BYTES,
) -> tuple[dict[str, Any] | None, str]:
    """The config for `fingerprint` and where it came from: "server", "not modified" (the
    cached copy, confirmed by a 304), "cache: <why the server could not be used>", or None and
    the reason there is none. Only configs that validate for `fingerprint` are returned or cached.

    `mode="train"` asks for the training config, filed apart from the inference one. A reply
    larger than `max_bytes` is not read past the cap and counts as unusable.

    Raises nothing for network or server trouble.
    """
    kind = Device.parse(device).kind  # the service files configs per kind: "cuda" for "cuda:1"
    slot = kind if mode == "infer" else f"{kind}-{mode}"  # the local cache's file
    cache = ConfigCache(cache_dir or DEFAULT_CACHE) if use_cache else None
    etag, cached = cache.load(fingerprint, slot) if cache else (None, None)
    headers = {"If-None-Match": etag} if etag and cached is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{server.rstrip('/')}/api/v1/configs/{fingerprint}"
    try:
        params = {"device": kind} if mode == "infer" else {"device": kind, "mode": mode}
        response = _get(url, params, headers, timeout, max_bytes)
    except ReplyTooLarge as exc:
        return _or_cached(
            cached,
            f"the server's reply is larger than the {max_bytes}-byte cap on a config ({exc})",
        )
    except httpx.HTTPError as exc:
        what = "timed out" if isinstance(exc, httpx.TimeoutException) else "unreachable"
        return _or_cached(cached, f"server {server} {what} ({type(exc).__name__}: {exc})")
    status = response.status_code
    if status == 304 and cached is not None:
        return cached, "not modified"
    if status == 200:
        try:
            config = response.json()
            checked_config(config, fingerprint)
        except ValueError as exc:
            return _or_cached(cached, f"the server sent an unusable config: {exc}")
        if cache:
            cache.save(fingerprint, slot, response.headers.get("ETag"), config)
        return config, "server"
    if status == 404:
        if cache:
            cache.forget(fingerprint, slot)
        what = "config" if mode == "infer" else f"{mode}ing config"
        return None, f"no tuned {what} for fingerprint {fingerprint} on {kind} at {server}"
    return _or_cached(cached, f"server {server} answered {status}{_detail(response)}")


def _as_program(program_or_module: Any, example_inputs: tuple | None) -> ExportedProgram:
    if isinstance(program_or_module, ExportedProgram):
        return program_or_module
    if isinstance(program_or_module, nn.Module):
        if example_inputs is None:
            raise ValueError("pass example_inputs to tune an nn.Module (it is exported first)")
        from tuner.graph.capture import export_module

        return export_module(program_or_module, example_inputs)
    raise TypeError(
        f"expected an ExportedProgram, a .pt2 path or an nn.Module, not "
        f"{type(program_or_module).__name__}"
    )


def _untuned(program_or_module: Any, program: ExportedProgram | None, device: Device) -> nn.Module:
    """What the caller would have run without fxtune."""
    if isinstance(program_or_module, nn.Module):
        return program_or_module
    if program is None:
        raise TypeError(f"cannot run a {type(program_or_module).__name__} as a model")
    with contextlib.suppress(Exception):
        own = program is not program_or_module
        return _placed(program, device, own=own).module()
    module = program.module()
    with contextlib.suppress(Exception):
        module = module.to(device.torch_device)
    return module


def _placed(program: ExportedProgram, device: Device, *, own: bool) -> ExportedProgram:
    """`program` on `device`, the devices export baked into its graph moved too
    (`tuner.graph.capture.on_device`): `module.to()` moves weights only, and a transformer's
    mask built with `device=cpu` then mixes devices on the first call. The move is in place, so
    a program the caller handed in (`own=False`) is copied first (saved and loaded in memory:
    a deep copy renames placeholders called `input`)."""
    if device.kind == "cpu":
        return program
    from tuner.graph.capture import on_device

    if not own:
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        buffer.seek(0)
        program = torch.export.load(buffer)
    return on_device(program, device.torch_device)


def _check_replayed(passes: list[PassStep], tuned: Transformed) -> None:
    """Every site the config names must have been rewritten: a partial replay is a
    combination that was never verified (e.g. a pass whose site ids changed between versions)."""
    wanted = {(step.pass_name, s) for step in passes for s in step.sites}
    missing = wanted - {(site.pass_name, site.id) for site in tuned.applied}
    if missing:
        names = ", ".join(sorted(f"{p}:{s}" for p, s in missing))
        raise LookupError(f"the config's sites {names} are not in this model")


def _compiled(
    module: nn.Module,
    backend: str,
    inputs: tuple[Any, ...],
    device: Device,
    settings: str | None = None,
) -> nn.Module:
    """The module as its backend runs it (`tuner.backends.registry.deployed`: torch.compile, CUDA
    graphs). Both are lazy: built now, on sample inputs (of the size bucket, where there are
    buckets), so a failure shows here (where it can fall back) and not at the deployment's
    first request."""
    wrapped = deployed(backend, module, settings, device.kind)
    inputs = tuple(x.to(device.torch_device) if isinstance(x, torch.Tensor) else x for x in inputs)
    with torch.no_grad():
        wrapped(*inputs)
    return wrapped


def _trainable(tuned: Transformed, device: Device) -> nn.Module:
    """A training config's module, re-exported: the original's state_dict keys (no wrapper
    prefix), parameters an optimizer trains, and export's own guard on input shapes."""
    from tuner.graph.capture import to_program

    if tuned.packers:
        raise LookupError(
            "the training config packs the inputs (combine_sparse_inputs); load_tuned keeps "
            "signatures only at inference: use the tuned .pt2 and its packed inputs"
        )
    inputs = tuple(
        x.to(device.torch_device) if isinstance(x, torch.Tensor) else x for x in tuned.inputs
    )
    return to_program(tuned.gm.to(device.torch_device), inputs).module()


def _tuned(
    program: ExportedProgram,
    device: Device,
    compile: bool,
    mode: Mode = "infer",
    *,
    own: bool = True,
    **fetch: Any,
) -> tuple[nn.Module, list[str]]:
    """The tuned module and what the caller should be warned about; raises on any failure.
    `own`: whether `program` is this call's to move (loaded or exported here)."""
    fingerprint = model_fingerprint(program)  # of the program as uploaded, before any move
    raw, source = fetch_config(fingerprint, device=device, mode=mode, **fetch)
    if raw is None:
        raise LookupError(source)
    program = _placed(program, device, own=own)
    log.info("fxtune: config for %s (%s) from %s", fingerprint, device, source)
    config = checked_config(raw, fingerprint)
    if config.mode != mode:
        raise LookupError(f"the config was tuned for mode {config.mode!r}, not {mode!r}")
    notes: list[str] = []
    if source.startswith("cache: "):
        notes.append(f"using the cached config ({source.removeprefix('cache: ')})")
    elsewhere = measured_elsewhere(config.hardware, describe(device))
    if elsewhere:  # logged, not warned: the module is tuned and correct
        log.warning("fxtune: %s", elsewhere)
    if mode == "train":
        tuned = apply_config(program, config)
        _check_replayed(config.passes, tuned)
        if config.backend == "compile":
            notes.append("the config chose torch.compile: wrap the module in it to train faster")
        return _trainable(tuned, device), notes
    if config.buckets:
        spec, module = _dispatching(program, config, device, compile, notes)
    else:
        tuned = apply_config(program, config)
        spec, module = _replayed(program, config.passes, tuned, device)
        if compile and is_runtime(config.backend):
            module = _runtime_or_fallback(program, config, tuned, device, notes, mode, **fetch)
        elif compile:
            settings = config.whole_model.settings
            inputs = _example_inputs(program)
            module = _maybe_compiled(module, config.backend, inputs, device, notes, settings)
    return CheckedInputs(module, spec, program.module), notes


def measured_elsewhere(tuned_on: dict[str, Any], here: dict[str, Any]) -> str | None:
    """Why the config's measurements may not hold in this process (None when the CPU or GPU
    name, the torch version and, on a CPU, the thread count are this process's): the config is
    still correct, but its choices were the fastest where it was tuned. A run beside other
    work tunes on the cores left free, and which backend wins can change with the thread count
    (EfficientNet-B0 tuned on 1 thread chose torch.compile, 1.77x against AOTInductor's 1.38x;
    on 2 quiet threads AOTInductor was 1.45x, torch.compile 1.28x)."""
    fields = [("name", "on"), ("torch", "torch")]
    if Device.parse(here["device"]).kind == "cpu":  # a GPU's kernels do not run on the threads
        fields.append(("threads", "threads"))
    differs = [(field, what) for field, what in fields if tuned_on.get(field) != here.get(field)]
    if not differs:
        return None
    said = ", ".join(f"{what} {tuned_on.get(f)} (here {here.get(f)})" for f, what in differs)
    advice = "tune where it deploys"
    if ("threads", "threads") in differs:
        advice += f", with `fxtune tune --threads {here.get('threads')}`"
    return f"the config was measured elsewhere: {said}; its choices may be slower here ({advice})"


def _example_inputs(program: ExportedProgram) -> tuple[Any, ...]:
    from tuner.graph.capture import example_inputs

    return example_inputs(program)


def _replayed(
    program: ExportedProgram, passes: list[PassStep], tuned: Transformed, device: Device
) -> tuple[ShapeSpec, nn.Module]:
    """A replayed module checked (every site rewritten, shapes kept), on the device."""
    _check_replayed(passes, tuned)
    spec = spec_of(tuned.gm)
    if spec is None:
        raise LookupError("the replayed module lost the program's input shapes")
    tuned.gm.to(device.torch_device)
    return spec, PackedInputs(tuned) if tuned.packers else tuned.gm


def _maybe_compiled(
    module: nn.Module,
    backend: str,
    inputs: tuple[Any, ...],
    device: Device,
    notes: list[str],
    settings: str | None = None,
) -> nn.Module:
    """`module` under `backend` (with inductor's `settings`, by name), or as it is with a note
    where that fails."""
    if backend not in DEPLOYED:
        return module
    try:
        return _compiled(module, backend, inputs, device, settings)
    except Exception as exc:
        notes.append(
            f"{backend} failed ({type(exc).__name__}: {exc}); running the tuned passes without it"
        )
        return module


def _runtime_or_fallback(
    program: ExportedProgram,
    config: TunedConfig,
    tuned: Transformed,
    device: Device,
    notes: list[str],
    mode: Mode,
    *,
    server: str,
    cache_dir: Path | None = None,
    token: str | None = None,
    **_: Any,
) -> nn.Module:
    """The config's runtime artifact as a module (`tuner.deploy.runtime_module`), or, where
    the runtime is not installed here or its artifact cannot be used, the config's fallback
    (the next-best candidate it measured), with a note naming why."""
    from tuner.deploy.runtime_module import (
        RuntimeUnusable,
        fallback_passes,
        fetch_runtime_artifact,
        load_runtime_module,
    )

    try:
        if device.kind != "cpu":
            raise RuntimeUnusable(f"{config.backend} runs on the CPU, not on {device}")
        if installed_version(config.backend) is None:
            hint = RUNTIMES[config.backend].install_hint()
            raise RuntimeUnusable(f"{config.backend} is not installed ({hint})")
        root = cache_dir or DEFAULT_CACHE
        artifact = fetch_runtime_artifact(
            config, server=server, cache_dir=root, token=token, mode=mode
        )
        return load_runtime_module(program, config, artifact, tuned)
    except RuntimeUnusable as exc:
        backend, passes, name = fallback_passes(config)
        notes.append(f"the config chose {config.backend}, but {exc}: running its fallback, {name}")
    fallback = replay_steps(program, passes)
    _, module = _replayed(program, passes, fallback, device)
    settings = config.fallback.settings if config.fallback is not None else None
    return _maybe_compiled(module, backend, _example_inputs(program), device, notes, settings)


def _dispatching(
    program: ExportedProgram, config: TunedConfig, device: Device, compile: bool, notes: list[str]
) -> tuple[ShapeSpec, nn.Module]:
    """Each size bucket's module, built once, behind a `SizeDispatch` that picks per call."""
    from tuner.deploy.dispatch import SizeDispatch
    from tuner.graph.sizes import resized_inputs

    replayed = apply_buckets(program, config)
    buckets = [b for b, _ in replayed]
    checked = [_replayed(program, b.passes, tuned, device) for b, tuned in replayed]
    spec, modules = checked[0][0], [m for _, m in checked]
    covered = _covers(spec, buckets)  # before any compile: a config it refuses costs nothing
    if covered is not None:
        raise LookupError(covered)
    if compile:
        for k, bucket in enumerate(buckets):
            if bucket.backend in DEPLOYED:
                at = {bucket.dim: bucket.measured[0] if bucket.measured else bucket.min}
                inputs = resized_inputs(spec, _example_inputs(program), at)
                modules[k] = _maybe_compiled(modules[k], bucket.backend, inputs, device, notes)
    return spec, SizeDispatch(spec, buckets, modules)


def _covers(spec: ShapeSpec, buckets: list[Bucket]) -> str | None:
    """Why the buckets do not tile the dimension's range exactly (None when they do): a gap
    would have no module and an overlap two; either means a config this client will not use."""
    try:
        dim = spec.dim(buckets[0].dim)
    except KeyError as exc:
        return str(exc.args[0])
    expected = dim.min
    for b in buckets:
        if b.dim != buckets[0].dim or b.min != expected or (b.max is not None and b.max < b.min):
            return f"the config's size buckets do not tile {dim.describe()}"
        expected = (b.max or 0) + 1
    if buckets[-1].max != dim.max:
        return f"the config's size buckets do not tile {dim.describe()}"
    return None


def load_tuned(
    program_or_module: ExportedProgram | nn.Module | str | Path,
    *,
    server: str,
    device: Device | str = "cpu",
    example_inputs: tuple | None = None,
    cache_dir: Path | None = None,
    timeout: float = 5.0,
    token: str | None = None,
    compile: bool = True,
    mode: Literal["infer", "train"] = "infer",
) -> nn.Module:
    """The model with its tuned config applied, or untuned with one warning when that fails.

    `device` picks the config (by device kind) and where the tuned module's weights go.
    `timeout` bounds the whole HTTP exchange. `token` defaults to FXTUNE_API_TOKEN.
    With `compile=True`, the module is run as its config's backend runs it and built here once:
    torch.compile for inductor and compile (the service's AOTInductor package avoids even
    that), "reduce-overhead" for compile-cudagraphs, and `tuner.backends.cuda_graphs.GraphedModule`
    for cudagraph (one graph per input signature; other signatures run ungraphed).
    A tuned module whose inputs were packed (combine_sparse_inputs) still takes the original
    inputs (`PackedInputs`). A .pt2 path is loaded with fxtune's restricted loader; a file it
    refuses raises (there is no model to fall back to).

    `mode="train"` asks for a training config (`fxtune tune --mode train`, a program exported
    in train mode): the result is a plain module with the original's state_dict keys whose
    parameters an optimizer trains; it is not compiled (a note says when the config chose
    torch.compile) and inputs of other shapes raise export's guard error. A config of the
    other mode is not applied (untuned, with one warning).
    """
    device = Device.parse(device)  # a malformed device is the caller's bug: no silent fallback
    if token is None:
        token = os.environ.get("FXTUNE_API_TOKEN") or None
    program: ExportedProgram | None = None
    if isinstance(program_or_module, (str, Path)):
        from tuner.loading.load import load_program

        program = load_program(program_or_module)
    try:
        if program is None:
            program = _as_program(program_or_module, example_inputs)
        module, notes = _tuned(
            program,
            device,
            compile,
            mode,
            own=program is not program_or_module,
            server=server,
            cache_dir=cache_dir,
            timeout=timeout,
            token=token,
        )
    except Exception as exc:
        warnings.warn(
            f"fxtune: running the model untuned: {exc}", FxtuneClientWarning, stacklevel=2
        )
        return _untuned(program_or_module, program, device)
    if notes:
        warnings.warn(f"fxtune: {'; '.join(notes)}", FxtuneClientWarning, stacklevel=2)
    return module
