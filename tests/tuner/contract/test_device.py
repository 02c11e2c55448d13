"""One Device value: parsed once, the index kept from the CLI to the profile, one error type."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from typer.testing import CliRunner

from service.api.schemas import ClaimIn, JobCreate
from tests.service.fakes import HARDWARE
from tests.service.helpers import tiny_program
from tuner.cli import app
from tuner.contract.device import KINDS, Device, DeviceKind
from tuner.contract.errors import DeviceUnavailableError, UnsupportedDeviceError
from tuner.host import hardware
from tuner.measure.timing import compare
from tuner.profiling.profile import profile_callable
from tuner.tuning.tuner import TuneOptions, Tuner
from worker.client import Assignment, ServiceClient
from worker.config import WorkerSettings
from worker.loop import Worker


def _present(name: str, indexed: bool = True) -> DeviceKind:
    return DeviceKind(name, indexed=indexed, missing=lambda d: None)


@pytest.mark.parametrize("text", ["cpu", "cuda", "cuda:1", "xla", "xla:0"])
def test_str_round_trips(text: str) -> None:
    device = Device.parse(text)
    assert str(device) == text and Device.parse(device) is device
    assert device.torch_device == torch.device(text)


@pytest.mark.parametrize("text", ["tpu", "meta", "cuda:", "cuda:x", "cpu:1", ":1", "", "cuda:-1"])
def test_bad_strings_raise_one_error_type(text: str) -> None:
    with pytest.raises(UnsupportedDeviceError):
        Device.parse(text)


def test_describe_keeps_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """describe() dropped the index, so outputs.py profiled a cuda:1 run's baseline on cuda:0."""
    seen: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: seen.append(d) or "GPU")
    info = hardware.describe(Device.parse("cuda:1"))
    assert info["device"] == "cuda:1" and seen == [torch.device("cuda:1")]
    # Decisions transfer between identical GPUs: the key is per kind and name.
    assert hardware.hardware_key(info).startswith("cuda|GPU|")


def test_xla_without_torch_xla_fails_at_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "xla", DeviceKind("xla", True, lambda d: "torch_xla is not here"))
    with pytest.raises(DeviceUnavailableError, match="torch_xla"):
        Tuner(TuneOptions(device="xla"))


def test_an_xla_that_cannot_be_timed_is_refused_before_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With torch_xla installed, `--device xla` passed validation, then failed in compare."""
    monkeypatch.setitem(KINDS, "xla", _present("xla"))
    with pytest.raises(DeviceUnavailableError, match="timing on 'xla'"):
        Tuner(TuneOptions(device="xla"))


def test_cli_refuses_a_missing_device_before_loading(tmp_path: Path) -> None:
    missing = "cuda:7" if torch.cuda.device_count() < 8 else "xla"
    result = CliRunner().invoke(
        app,
        ["tune", str(tmp_path / "absent.pt2"), "--device", missing, "--out", "o", "--report", "r"],
    )
    assert result.exit_code == 4, result.output
    assert "not available" in result.output
    bad = CliRunner().invoke(app, ["profile", "m.pt2", "--device", "tpu"])
    assert bad.exit_code == 2 and "unknown device 'tpu'" in bad.output


@pytest.mark.skipif(torch.cuda.device_count() > 1, reason="this machine has cuda:1")
def test_profile_refuses_an_absent_indexed_gpu_as_missing_not_unknown() -> None:
    with pytest.raises(DeviceUnavailableError, match="cuda:1"):
        profile_callable(lambda: None, device="cuda:1")


def test_a_worker_tunes_on_its_own_gpu_and_claims_the_kind(tmp_path: Path) -> None:
    """The job names a kind; the child must tune on the worker's cuda:1, not on cuda (0)."""
    settings = WorkerSettings(worker_sandbox="none")  # the command only; nothing runs
    worker = Worker(settings, "cuda:1", HARDWARE, ServiceClient("http://x", None))
    job = Assignment(1, 1, "cuda", None, "token", 30.0, "0" * 64, 1, "m", "/file")
    cmd = worker.command(job, tmp_path / "m.pt2", tmp_path, tmp_path)
    assert cmd[cmd.index("--device") + 1] == "cuda:1"
    assert worker.device.kind == "cuda" and worker.id.endswith("-cuda:1")


def test_the_api_accepts_the_tuners_kinds_and_no_index() -> None:
    for kind in KINDS:
        assert JobCreate(device=kind).device == kind
    for bad in ("cuda:1", "tpu"):
        with pytest.raises(ValidationError):
            JobCreate(device=bad)
        with pytest.raises(ValidationError):
            ClaimIn(worker_id="w", device=bad)


def test_options_hold_a_parsed_device() -> None:
    assert TuneOptions(device="cuda:1").device == Device("cuda", 1)
    with pytest.raises(UnsupportedDeviceError):
        TuneOptions(device="cuda:one")


@pytest.mark.cuda
def test_timing_and_profiling_stay_on_the_indexed_gpu(tmp_path: Path) -> None:
    last = Device("cuda", torch.cuda.device_count() - 1)
    x = torch.randn(64, 64, device=last.torch_device)
    c = compare(lambda: x @ x, lambda: x @ x, device=last, budget_s=0.3)
    assert c.device == str(last)
    summary = profile_callable(lambda: x @ x, device=str(last), iterations=2, warmup=1)
    assert summary.device == str(last) and summary.peak_memory_bytes


@pytest.mark.cuda
def test_tuner_measures_on_the_indexed_gpu(tmp_path: Path) -> None:
    last = f"cuda:{torch.cuda.device_count() - 1}"
    tiny_program(tmp_path / "m.pt2")
    tuner = Tuner(TuneOptions(device=last, budget_s=5, workdir=tmp_path))
    assert str(tuner.run.device) == last and tuner.run.hardware["device"] == last
