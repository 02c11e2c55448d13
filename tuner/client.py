"""The deployment client: pick up the tuned config for a model, or run it untuned.

Importable with the tuner and httpx alone (no service dependencies). A deployment must never
fail because of fxtune: every failure (server down, timeout, no config yet, the model changed so
its fingerprint has no config) ends in the untuned module and one clear warning.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import httpx
import torch
from torch import nn
from torch.export import ExportedProgram

from tuner.apply import Transformed
from tuner.config import TunedConfig, apply_config
from tuner.fingerprint import model_fingerprint

DEFAULT_CACHE = Path.home() / ".cache" / "fxtune" / "configs"


class FxtuneClientWarning(UserWarning):
    """Tuning could not be used; the module runs untuned."""


class PackedInputs(nn.Module):
    """Keeps the original call signature when a tuned program takes packed inputs."""

    def __init__(self, tuned: Transformed) -> None:
        super().__init__()
        self.tuned = tuned.gm
        self._transformed = tuned

    def forward(self, *args: Any) -> Any:
        return self.tuned(*self._transformed.pack(tuple(args)))


class ConfigCache:
    """Config JSON plus its ETag on disk, per fingerprint and device."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, fingerprint: str, device: str) -> Path:
        return self.root / f"{fingerprint}-{device}.json"

    def load(self, fingerprint: str, device: str) -> tuple[str | None, dict[str, Any] | None]:
        path = self._path(fingerprint, device)
        try:
            doc = json.loads(path.read_text())
            return doc["etag"], doc["config"]
        except (OSError, ValueError, KeyError):
            return None, None

    def save(self, fingerprint: str, device: str, etag: str | None, config: dict) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        path = self._path(fingerprint, device)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"etag": etag, "config": config}))
        tmp.replace(path)


def fetch_config(
    fingerprint: str,
    *,
    server: str,
    device: str = "cpu",
    cache_dir: Path | None = None,
    timeout: float = 5.0,
    token: str | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """The config for `fingerprint` and where it came from: "server", "not modified", "cache".

    Raises nothing for network trouble: returns (cached config or None, reason).
    """
    cache = ConfigCache(cache_dir or DEFAULT_CACHE)
    etag, cached = cache.load(fingerprint, device)
    headers = {"If-None-Match": etag} if etag and cached is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{server.rstrip('/')}/api/v1/configs/{fingerprint}"
    try:
        response = httpx.get(url, params={"device": device}, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        reason = f"server unreachable ({type(exc).__name__})"
        return cached, f"cache: {reason}" if cached is not None else reason
    if response.status_code == 304 and cached is not None:
        return cached, "not modified"
    if response.status_code == 200:
        config = response.json()
        cache.save(fingerprint, device, response.headers.get("ETag"), config)
        return config, "server"
    if response.status_code == 404:
        return None, f"no tuned config for fingerprint {fingerprint} on {device}"
    reason = f"server answered {response.status_code}"
    return cached, f"cache: {reason}" if cached is not None else reason


def _as_program(program_or_module: Any, example_inputs: tuple | None) -> ExportedProgram:
    if isinstance(program_or_module, ExportedProgram):
        return program_or_module
    if isinstance(program_or_module, (str, Path)):
        from tuner.load import load_program

        return load_program(program_or_module)
    if isinstance(program_or_module, nn.Module):
        if example_inputs is None:
            raise ValueError("pass example_inputs to tune an nn.Module (it is exported first)")
        from tuner.capture import export_module

        return export_module(program_or_module, example_inputs)
    raise TypeError(
        f"expected an ExportedProgram, a .pt2 path or an nn.Module, not "
        f"{type(program_or_module).__name__}"
    )


def _untuned(program_or_module: Any, program: ExportedProgram | None) -> nn.Module:
    if isinstance(program_or_module, nn.Module):
        return program_or_module
    if program is not None:
        return program.module()
    return _as_program(program_or_module, None).module()


def load_tuned(
    program_or_module: ExportedProgram | nn.Module | str | Path,
    *,
    server: str,
    device: str = "cpu",
    example_inputs: tuple | None = None,
    cache_dir: Path | None = None,
    timeout: float = 5.0,
    token: str | None = None,
    compile: bool = True,
) -> nn.Module:
    """The model with its tuned config applied, or untuned with one warning when that fails.

    With `compile=True`, a config whose chosen backend is inductor is wrapped in torch.compile
    (the AOTInductor package from the service avoids even that compile).
    """
    program: ExportedProgram | None = None
    try:
        program = _as_program(program_or_module, example_inputs)
        fingerprint = model_fingerprint(program)
        raw, source = fetch_config(
            fingerprint,
            server=server,
            device=device,
            cache_dir=cache_dir,
            timeout=timeout,
            token=token,
        )
        if raw is None:
            raise LookupError(source)
        config = TunedConfig.model_validate(raw)
        if config.model_fingerprint != fingerprint:
            raise LookupError("the config's fingerprint does not match the model (it changed)")
        tuned = apply_config(program, config)
        tuned.gm.to(device)
        module: nn.Module = PackedInputs(tuned) if tuned.packers else tuned.gm
        if compile and config.backend == "inductor":
            module = torch.compile(module)
        if source.startswith("cache:"):
            warnings.warn(
                f"fxtune: using the cached config ({source[7:]})", FxtuneClientWarning, stacklevel=2
            )
        return module
    except Exception as exc:
        warnings.warn(
            f"fxtune: running the model untuned: {exc}", FxtuneClientWarning, stacklevel=2
        )
        return _untuned(program_or_module, program)
