"""A deployment's module for a config whose backend is a runtime (OpenVINO, ONNX Runtime).

The config names its artifact by digest (`runtime.sha256`); the artifact is fetched from the
service (`fetch_runtime_artifact`, kept in a local cache by digest), checked as data again here
(`tuner.backends.runtime_files`: no external data, custom operators or extensions, whatever the
service said), loaded, and checked once against the config replayed in eager on the program's
example inputs and fresh variants of them. `RuntimeModule` then runs it with the original's
call signature (the inputs packed where a pass repacks them). Where the runtime is not
installed, or any of that fails, the config's fallback runs instead (`fallback_module`): the
next-best candidate the run measured, replayed, under its backend; the caller warns once.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import torch
from torch import nn
from torch.export import ExportedProgram

from tuner.backends.runtimes import RUNTIMES, installed_version
from tuner.contract.config import TunedConfig
from tuner.contract.hardware import hardware_key

# A runtime artifact is at most an ONNX file's 2 GB (protobuf's limit) or an IR of that size.
MAX_ARTIFACT_BYTES = 2 * 1024**3 + 1024**2
# The whole download of an artifact: larger than a config's, still bounded.
ARTIFACT_TIMEOUT_S = 120.0
# Fresh input sets the loaded artifact is checked on, besides the program's example.
CHECK_TRIALS = 2


class RuntimeUnusable(LookupError):
    """The config's runtime cannot run here (says why); its fallback runs instead."""


class RuntimeModule(nn.Module):
    """The runtime's artifact, called as the original program is (`pack`: the original's
    inputs to the artifact's, for a pass that repacks them)."""

    def __init__(self, runner: Callable[..., Any], pack: Callable[[tuple], tuple]) -> None:
        super().__init__()
        self.runner = runner
        self._pack = pack

    def forward(self, *args: Any) -> Any:
        return self.runner(*self._pack(tuple(args)))


def artifact_cache_path(cache_dir: Path, runtime: str, sha256: str) -> Path:
    return cache_dir / "runtime" / f"{sha256}{RUNTIMES[runtime].suffix}"


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _download(url: str, params: dict[str, str], headers: dict[str, str], dest: Path) -> None:
    """Stream `url` into `dest`, the whole exchange within ARTIFACT_TIMEOUT_S (a thread that is
    abandoned when late, as the config's fetch does) and at most MAX_ARTIFACT_BYTES."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            with (
                httpx.Client(timeout=30.0) as client,
                client.stream("GET", url, params=params, headers=headers) as response,
                dest.open("wb") as out,
            ):
                if response.status_code != 200:
                    result["error"] = RuntimeUnusable(
                        f"the service answered {response.status_code} for the runtime artifact"
                    )
                    return
                size = 0
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > MAX_ARTIFACT_BYTES:
                        raise RuntimeUnusable(f"the artifact is over {MAX_ARTIFACT_BYTES} bytes")
                    out.write(chunk)
        except Exception as exc:
            result["error"] = exc

    thread = threading.Thread(target=run, name="fxtune-artifact-fetch", daemon=True)
    thread.start()
    thread.join(ARTIFACT_TIMEOUT_S)
    if thread.is_alive():
        raise RuntimeUnusable(f"the artifact did not arrive within {ARTIFACT_TIMEOUT_S:g} s")
    if "error" in result:
        raise result["error"]


def fetch_runtime_artifact(
    config: TunedConfig,
    *,
    server: str,
    cache_dir: Path,
    token: str | None = None,
    mode: str = "infer",
) -> Path:
    """The config's runtime artifact on disk (from the local cache by digest, else fetched),
    its bytes the ones the config names; RuntimeUnusable otherwise."""
    record = config.runtime
    if record is None or record.sha256 is None:
        why = record.reason if record is not None and record.reason else "none was shipped"
        raise RuntimeUnusable(f"the config has no {config.backend} artifact ({why})")
    path = artifact_cache_path(cache_dir, record.runtime, record.sha256)
    if path.is_file() and _digest(path) == record.sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {
        "sha256": record.sha256,
        "device": "cpu",
        "hardware": hardware_key(config.hardware),
        "mode": mode,
    }
    url = f"{server.rstrip('/')}/api/v1/configs/{config.model_fingerprint}/runtime"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".fetch-", suffix=".part")
    os.close(fd)
    try:
        _download(url, params, headers, Path(tmp))
        if _digest(Path(tmp)) != record.sha256:
            raise RuntimeUnusable("the fetched artifact is not the one the config names")
        os.replace(tmp, path)
    except httpx.HTTPError as exc:
        raise RuntimeUnusable(f"could not fetch the artifact ({type(exc).__name__})") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return path


def load_runtime_module(
    program: ExportedProgram, config: TunedConfig, artifact: Path, tuned: Any
) -> nn.Module:
    """The artifact as a module with the original's call signature, checked against `tuned`
    (the config replayed on `program`, `tuner.passes.apply.Transformed`) on the example inputs
    and fresh variants; RuntimeUnusable where the runtime is missing, the artifact is refused
    or its outputs differ."""
    from tuner.backends.runtime_build import load_runner
    from tuner.backends.runtime_files import check_artifact
    from tuner.graph.capture import example_inputs
    from tuner.measure.equivalence import check_outputs
    from tuner.measure.inputs import fresh_inputs

    runtime = config.backend
    if installed_version(runtime) is None:
        raise RuntimeUnusable(f"{runtime} is not installed ({RUNTIMES[runtime].install_hint()})")
    try:
        check_artifact(runtime, artifact)
        runner = load_runner(runtime, artifact, program.call_spec.out_spec, torch.get_num_threads())
    except Exception as exc:
        raise RuntimeUnusable(f"its {runtime} artifact was refused: {exc}") from None
    module = RuntimeModule(runner, tuned.pack)
    inputs = example_inputs(program)
    trials = [inputs, *fresh_inputs(inputs, CHECK_TRIALS, seed=2024)]
    try:
        wrong = check_outputs(lambda *a: tuned.gm(*tuned.pack(a)), module, trials)
    except Exception as exc:
        wrong = f"{type(exc).__name__}: {exc}"
    if wrong is not None:
        raise RuntimeUnusable(f"its {runtime} artifact does not answer as the config: {wrong}")
    return module


def fallback_passes(config: TunedConfig) -> tuple[str, list[Any], str]:
    """(backend, passes, name) a deployment runs instead of the config's runtime."""
    fb = config.fallback
    if fb is None:  # a config without one: its own passes, in eager
        return "eager", list(config.passes), "its passes in eager"
    return fb.backend, list(fb.passes), fb.name
