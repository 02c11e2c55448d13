"""`fxtune` exit codes: one per kind of failure, so the worker retries only what may pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner, Result

import tuner.checks.inspect
import tuner.loading.bounds
import tuner.loading.load
import tuner.measure.timing as timing
from tests.crafted import good_program, traversal_names
from tests.tuner.tuning_fixtures import BuggyRelu, registered
from tuner.cli import app
from tuner.contract.errors import (
    ArtifactFormatError,
    CompileCrashed,
    CompileOverrun,
    DeviceUnavailableError,
    FxtuneError,
    InputError,
    LoaderUnavailableError,
    PassError,
    RankFailedError,
    UnsafeArtifactError,
    UnsupportedDeviceError,
)
from tuner.contract.exit_codes import ExitCode, exit_code_for
from tuner.graph.capture import export_module, save_program
from tuner.profiling.profile import ProfileError

ABSENT_GPU = f"cuda:{torch.cuda.device_count()}"  # one past the last, on any machine


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UnsafeArtifactError("x"), ExitCode.REFUSED),
        (DeviceUnavailableError("x"), ExitCode.DEVICE),
        (LoaderUnavailableError("x"), ExitCode.INTERNAL),
        (RankFailedError("x"), ExitCode.INTERNAL),
        (CompileOverrun("x"), ExitCode.INTERNAL),  # escaped the candidate it belonged to
        (CompileCrashed("SIGSEGV", 11), ExitCode.INTERNAL),
        (ArtifactFormatError("x"), ExitCode.USER_INPUT),
        (PassError("x"), ExitCode.USER_INPUT),
        (ProfileError("x"), ExitCode.USER_INPUT),
        (InputError("x"), ExitCode.USER_INPUT),
        (UnsupportedDeviceError("x"), ExitCode.USER_INPUT),
        (FxtuneError("x"), ExitCode.USER_INPUT),
        (ValueError("a bug"), ExitCode.INTERNAL),
        (TypeError("a bug"), ExitCode.INTERNAL),
        (KeyError("a bug"), ExitCode.INTERNAL),
    ],
)
def test_each_error_type_has_its_code(exc: BaseException, code: ExitCode) -> None:
    assert exit_code_for(exc) == code


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return good_program(tmp_path_factory.mktemp("exit") / "good.pt2")


def _tune(model: Path, tmp_path: Path, *extra: str) -> tuple[int, str]:
    args = ["tune", str(model), "--out", str(tmp_path / "t.pt2")]
    args += ["--report", str(tmp_path / "r.json"), "--budget-s", "1", "--no-profile", *extra]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


def test_user_input_exits_2(good: Path, tmp_path: Path) -> None:
    not_an_archive = tmp_path / "notes.pt2"
    not_an_archive.write_text("hello")
    assert _tune(not_an_archive, tmp_path)[0] == ExitCode.USER_INPUT
    code, out = _tune(good, tmp_path, "--sizes", "batch")
    assert code == ExitCode.USER_INPUT and "name=1,32,512" in out
    assert CliRunner().invoke(app, ["sites", str(not_an_archive)]).exit_code == ExitCode.USER_INPUT


def test_a_malformed_stopping_rule_exits_2_before_the_model_is_read(
    good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(timing.TARGET_CI_ENV, "5 %")
    timing.stop_settings.cache_clear()  # read once per process: read it again, and after
    try:
        code, out = _tune(tmp_path / "absent.pt2", tmp_path)
    finally:
        timing.stop_settings.cache_clear()
    assert code == ExitCode.USER_INPUT and "FXTUNE_TIMING_TARGET_CI must be a number" in out


def test_a_refused_artifact_exits_3(good: Path, tmp_path: Path) -> None:
    refused = traversal_names(good, tmp_path / "traversal.pt2", "m/../../escaped")
    code, out = _tune(refused, tmp_path)
    assert code == ExitCode.REFUSED, out
    assert CliRunner().invoke(app, ["sites", str(refused)]).exit_code == ExitCode.REFUSED


def test_a_missing_device_exits_4(good: Path, tmp_path: Path) -> None:
    assert _tune(good, tmp_path, "--device", ABSENT_GPU)[0] == ExitCode.DEVICE
    profiled = CliRunner().invoke(app, ["profile", str(good), "--device", ABSENT_GPU])
    assert profiled.exit_code == ExitCode.DEVICE


@pytest.mark.parametrize(
    "raised", [ValueError("a bug in the tuner"), LoaderUnavailableError("no safe loader")]
)
def test_a_bug_or_a_broken_torch_exits_1(
    raised: Exception, good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2 told the worker "the user's fault, never retry" for any ValueError."""

    def broken(*_a: object, **_k: object) -> None:
        raise raised

    monkeypatch.setattr(tuner.loading.load, "load_program", broken)
    assert _tune(good, tmp_path)[0] == ExitCode.INTERNAL


def _planted(raised: BaseException) -> Callable[..., None]:
    def broken(*_a: object, **_k: object) -> None:
        raise raised

    return broken


def test_a_bug_in_the_schema_check_exits_1_from_tune_and_sites(
    good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug while loading an upload is not a bad upload (exit 2: never retried)."""
    monkeypatch.setattr(tuner.loading.load, "sanitize_program", _planted(AttributeError("bug")))
    assert _tune(good, tmp_path)[0] == ExitCode.INTERNAL
    assert CliRunner().invoke(app, ["sites", str(good)]).exit_code == ExitCode.INTERNAL


def test_a_bug_in_the_bounds_check_exits_1_where_torchs_refusal_exits_2(
    good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bounds check turned every exception into "its shapes do not propagate" (exit 2)."""
    monkeypatch.setattr(tuner.loading.bounds, "footprint", _planted(AttributeError("bug")))
    assert _tune(good, tmp_path)[0] == ExitCode.INTERNAL
    assert CliRunner().invoke(app, ["sites", str(good)]).exit_code == ExitCode.INTERNAL
    # the control: what torch raises on shapes that contradict an operator is the upload's fault
    contradiction = RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    monkeypatch.setattr(tuner.loading.bounds, "footprint", _planted(contradiction))
    code, out = _tune(good, tmp_path)
    assert code == ExitCode.USER_INPUT and "do not propagate" in out


class MostlyRelu(torch.nn.Module):
    """The relu is most of the model's time, so its site is measured, not left below noise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + 1.0


@pytest.fixture(scope="module")
def relu_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    program = export_module(MostlyRelu(), (torch.randn(256, 256),))
    return save_program(program, tmp_path_factory.mktemp("relu") / "relu.pt2")


def _tune_with_the_buggy_pass(model: Path, tmp_path: Path) -> Result:
    args = ["tune", str(model), "--out", str(tmp_path / "t.pt2"), "--report"]
    args += [str(tmp_path / "r.json"), "--budget-s", "20", "--no-profile", "--backend", "eager"]
    args += ["--cache", str(tmp_path / "cache.json")]
    with registered(BuggyRelu):
        return CliRunner().invoke(app, args)


@pytest.mark.usefixtures("allow_fallbacks")  # the planted bug becomes a "failed to run" site
def test_a_bug_in_a_pass_is_a_recorded_fallback_outside_strict_mode(
    relu_model: Path, tmp_path: Path
) -> None:
    result = _tune_with_the_buggy_pass(relu_model, tmp_path)
    assert result.exit_code == ExitCode.OK, result.output
    config = json.loads((tmp_path / "r.json").read_text())["config"]
    (site,) = [s for s in config["sites"] if s["pass"] == BuggyRelu.name]
    assert site["verdict"] == "failed to run"
    assert site["reason"].startswith("AttributeError: ")
    bugs = [e for e in config["tuning"]["errors"] if e["type"] == "AttributeError"]
    assert bugs and not any(e["expected"] for e in bugs)
    assert all("node.no_such_field" in e["traceback"] for e in bugs)
    assert any(e["where"].startswith(f"measuring site {BuggyRelu.name}:") for e in bugs)
    assert config["passes"] == []  # what ships leaves the buggy pass out


def test_a_bug_in_a_pass_exits_1_in_strict_mode(relu_model: Path, tmp_path: Path) -> None:
    result = _tune_with_the_buggy_pass(relu_model, tmp_path)
    assert result.exit_code == ExitCode.INTERNAL
    assert isinstance(result.exception, AttributeError)
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (ArtifactFormatError("its shapes do not propagate"), ExitCode.USER_INPUT),
        (MemoryError(), ExitCode.REFUSED),  # under the checker's address-space cap
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: 8589934592 bytes"), 3),
    ],
)
def test_the_upload_checker_exits_2_or_3_for_the_files_fault(
    raised: Exception, code: ExitCode, good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tuner.checks.inspect, "inspect_program", _planted(raised))
    args = ["fingerprint", str(good), "--out", str(tmp_path / "r.json")]
    assert tuner.checks.inspect.main(args) == code


@pytest.mark.parametrize("raised", [AttributeError("a bug"), RuntimeError("an internal assert")])
def test_a_bug_in_the_upload_checker_is_raised_so_it_exits_1(
    raised: Exception, good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service answers exit 1 with a 5xx, never "cannot be loaded" (tests/service)."""
    monkeypatch.setattr(tuner.checks.inspect, "inspect_program", _planted(raised))
    with pytest.raises(type(raised)):
        tuner.checks.inspect.main(["fingerprint", str(good), "--out", str(tmp_path / "r.json")])
