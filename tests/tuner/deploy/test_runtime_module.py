"""`load_tuned` for a config whose backend is a runtime: its artifact fetched by digest, checked
as data, run with the original's call signature; the config's fallback, with one warning, where
the runtime is missing or its artifact refused.

One artifact per runtime for the module, built from the config replayed on a small program (a
linear and an eval dropout, which the config's `remove_dropout` removes).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from tests.tuner.client_helpers import FakeService, dropped_program, load_recording, tuned_config
from tuner.backends import registry as backends
from tuner.backends.runtimes import RUNTIMES, installed_version
from tuner.cli import app
from tuner.deploy import client
from tuner.deploy.client import CheckedInputs
from tuner.deploy.replay import apply_config
from tuner.deploy.runtime_module import RuntimeModule
from tuner.graph.fingerprint import model_fingerprint

onnx = pytest.importorskip("onnx")

RUNTIME_PARAMS = [
    pytest.param(
        name,
        marks=pytest.mark.skipif(installed_version(name) is None, reason=f"{name} not installed"),
    )
    for name in ("onnxruntime", "openvino")
]


@pytest.fixture(scope="module")
def shipped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], bytes]]:
    """Per installed runtime: a schema-5 config choosing it, and its artifact's bytes."""
    program = dropped_program()
    work = tmp_path_factory.mktemp("artifacts")
    out: dict[str, tuple[dict[str, Any], bytes]] = {}
    for name in ("onnxruntime", "openvino"):
        if installed_version(name) is None:
            continue
        config = tuned_config(program, "remove_dropout")
        tuned = apply_config(program, config)
        built = backends.build(name, tuned.gm, tuned.inputs, work)  # in this process: no child
        assert built.package is not None
        data = built.package.read_bytes()
        config.update(
            schema_version=5,
            backend=name,
            runtime={
                "runtime": name,
                "version": installed_version(name),
                "format": RUNTIMES[name].format,
                "sha256": hashlib.sha256(data).hexdigest(),
            },
            fallback={
                "name": "eager + tuned passes",
                "backend": "eager",
                "passes": config["passes"],
            },
        )
        out[name] = (config, data)
    return out


def _serve(fake: FakeService, config: dict[str, Any], data: bytes) -> None:
    fake.configs[config["model_fingerprint"]] = config
    fake.runtime_files[config["runtime"]["sha256"]] = data


@pytest.mark.parametrize("runtime", RUNTIME_PARAMS)
def test_the_runtime_artifact_runs_with_the_original_signature(
    runtime: str,
    shipped: dict[str, tuple[dict[str, Any], bytes]],
    config_service: tuple[str, FakeService],
    tmp_path: Path,
) -> None:
    url, fake = config_service
    _serve(fake, *shipped[runtime])
    program = dropped_program()
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert warned == []
    assert isinstance(module, CheckedInputs) and isinstance(module.tuned, RuntimeModule)
    x = torch.randn(2, 6)
    torch.testing.assert_close(module(x), program.module()(x), rtol=1e-5, atol=1e-5)
    # The artifact is kept by digest: a deployment without the service still runs it.
    digest = shipped[runtime][0]["runtime"]["sha256"]
    assert [p.name for p in (tmp_path / "runtime").iterdir()] == [digest + RUNTIMES[runtime].suffix]


def test_without_the_runtime_installed_the_fallback_runs_with_one_warning(
    shipped: dict[str, tuple[dict[str, Any], bytes]],
    config_service: tuple[str, FakeService],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, fake = config_service
    runtime = next(iter(shipped))
    _serve(fake, *shipped[runtime])
    monkeypatch.setattr(client, "installed_version", lambda name: None)
    program = dropped_program()
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert len(warned) == 1, warned
    assert f"pip install 'fxtune[{runtime}]'" in warned[0] and "fallback" in warned[0]
    assert isinstance(module, CheckedInputs) and isinstance(module.tuned, torch.fx.GraphModule)
    assert not any("dropout" in str(n.target) for n in module.tuned.graph.nodes)
    x = torch.randn(2, 6)
    torch.testing.assert_close(module(x), program.module()(x))
    assert not any(path.split("?")[0].endswith("/runtime") for path, _ in fake.seen)


def _with_external_data(data: bytes) -> bytes:
    model = onnx.load_from_string(data)
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = onnx.TensorProto.EXTERNAL
    entry = weight.external_data.add()
    entry.key, entry.value = "location", "/etc/passwd"
    return model.SerializeToString()


@pytest.mark.skipif(installed_version("onnxruntime") is None, reason="onnxruntime not installed")
def test_an_onnx_file_with_an_external_data_path_is_refused_by_the_client(
    shipped: dict[str, tuple[dict[str, Any], bytes]],
    config_service: tuple[str, FakeService],
    tmp_path: Path,
) -> None:
    """Even when the service's copy and the config agree (a compromised service), the client
    checks the file as data itself and runs the fallback."""
    url, fake = config_service
    config, data = shipped["onnxruntime"]
    hostile = _with_external_data(data)
    named = {**config["runtime"], "sha256": hashlib.sha256(hostile).hexdigest()}
    config = {**config, "runtime": named}
    _serve(fake, config, hostile)
    module, warned = load_recording(dropped_program(), server=url, cache_dir=tmp_path)
    assert len(warned) == 1 and "external data" in warned[0] and "fallback" in warned[0], warned
    assert isinstance(module.tuned, torch.fx.GraphModule)


@pytest.mark.skipif(installed_version("onnxruntime") is None, reason="onnxruntime not installed")
def test_bytes_other_than_the_ones_the_config_names_are_not_run(
    shipped: dict[str, tuple[dict[str, Any], bytes]],
    config_service: tuple[str, FakeService],
    tmp_path: Path,
) -> None:
    url, fake = config_service
    config, data = shipped["onnxruntime"]
    fake.configs[config["model_fingerprint"]] = config
    fake.runtime_files[config["runtime"]["sha256"]] = data + b"\0"
    _, warned = load_recording(dropped_program(), server=url, cache_dir=tmp_path)
    assert len(warned) == 1 and "not the one the config names" in warned[0], warned


@pytest.mark.skipif(installed_version("onnxruntime") is None, reason="onnxruntime not installed")
def test_fetch_writes_the_runtime_artifact_or_exits_2(
    shipped: dict[str, tuple[dict[str, Any], bytes]],
    config_service: tuple[str, FakeService],
    tmp_path: Path,
) -> None:
    url, fake = config_service
    config, data = shipped["onnxruntime"]
    fingerprint = model_fingerprint(dropped_program())
    out = tmp_path / "tuned.onnx"
    args = ["fetch", fingerprint, "--server", url, "-o", str(tmp_path / "c.json")]
    fake.configs[fingerprint] = config
    missing = CliRunner().invoke(app, [*args, "--runtime-out", str(out)])
    assert missing.exit_code == 2 and not out.exists(), missing.output
    fake.runtime_files[config["runtime"]["sha256"]] = data
    result = CliRunner().invoke(app, [*args, "--runtime-out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == data
