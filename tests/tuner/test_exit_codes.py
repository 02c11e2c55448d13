"""`fxtune` exit codes: one per kind of failure, so the worker retries only what may pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import tuner.loading.load
from tests.crafted import good_program, traversal_names
from tuner.cli import app
from tuner.contract.errors import (
    ArtifactFormatError,
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
from tuner.profiling.profile import ProfileError

ABSENT_GPU = f"cuda:{torch.cuda.device_count()}"  # one past the last, on any machine


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UnsafeArtifactError("x"), ExitCode.REFUSED),
        (DeviceUnavailableError("x"), ExitCode.DEVICE),
        (LoaderUnavailableError("x"), ExitCode.INTERNAL),
        (RankFailedError("x"), ExitCode.INTERNAL),
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
