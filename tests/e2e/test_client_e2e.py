"""End to end: a deployment picks up its tuned config from a real service, tuned by a real worker.

One service and one worker tune a model once for the module (the eager backend keeps that to
seconds); each test then plays a deployment holding only the model file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from service.launch import serve_process
from tests.service.helpers import (
    POLL,
    REPO,
    children,
    fxtune_env,
    wait_for,
    worker_process,
)
from tests.tuner.client_helpers import load_recording
from tuner.cli import app
from tuner.deploy.client import CheckedInputs
from tuner.graph.fingerprint import model_fingerprint
from tuner.loading.load import load_program

pytestmark = pytest.mark.e2e

TUNE = json.dumps(
    [sys.executable, "-m", "fxtune_cli", "tune", "--backend", "eager", "--no-profile"]
)


class Dropouts(nn.Module):
    """48 eval dropouts after a linear: removing them is a clear win the tuner always measures."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.drops = nn.ModuleList(nn.Dropout(0.1) for _ in range(48))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.fc(x)
        for drop in self.drops:
            x = drop(x)
        return x


def save(module: nn.Module, x: torch.Tensor, path: Path) -> Path:
    torch.export.save(torch.export.export(module, (x,)), path)
    return path


def dropouts_in(module: nn.Module) -> int:
    if isinstance(module, CheckedInputs):  # load_tuned's input check around the tuned graph
        module = module.tuned
    assert isinstance(module, torch.fx.GraphModule)
    return sum(1 for n in module.graph.nodes if "dropout" in str(n.target))


@dataclass
class Tuned:
    url: str
    env: dict[str, str]
    log: Path
    model: Path  # uploaded and tuned
    reshaped: Path  # the same model exported for another batch size: another fingerprint
    stranger: Path  # never uploaded
    module: nn.Module
    model_id: int
    fingerprint: str


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuned]:
    root = tmp_path_factory.mktemp("client-e2e")
    torch.manual_seed(0)
    module = Dropouts().eval()
    model = save(module, torch.randn(2, 8), root / "dropouts.pt2")
    reshaped = save(module, torch.randn(3, 8), root / "reshaped.pt2")
    stranger = save(nn.Sequential(nn.Linear(8, 2)).eval(), torch.randn(2, 8), root / "new.pt2")
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(root / "data"),
        FXTUNE_WORKER_TUNE_COMMAND=TUNE,
        FXTUNE_WORKER_POLL_S="0.2",
        FXTUNE_TUNE_CACHE=str(root / "decisions.json"),
        # Each check (two uploads, two results) starts its own child: a warm checker started
        # ahead would add one more sandboxed Python importing torch per service, never used.
        FXTUNE_WARM_CHECKERS="0",
    )
    log = root / "serve.log"
    with (
        serve_process(env, log, "--log-level", "info") as url,
        worker_process(url, env, root / "worker.log"),
    ):
        with model.open("rb") as f:
            data = {"tune": "true", "budget_s": "30"}  # room to time the whole-model candidates
            up = httpx.post(f"{url}/api/v1/models", files={"file": f}, data=data, timeout=60)
        assert up.status_code == 201, up.text

        def finished() -> dict | None:
            job = POLL.get(f"{url}/api/v1/jobs/{up.json()['job']['id']}").json()
            return job if job["status"] in ("succeeded", "failed") else None

        job = wait_for(finished, 150, "the tuning job", 0.25)
        assert job["status"] == "succeeded", job
        fingerprint = model_fingerprint(load_program(model))
        yield Tuned(url, env, log, model, reshaped, stranger, module, up.json()["id"], fingerprint)


def config_requests(log: Path, fingerprint: str) -> list[int]:
    """The statuses the service logged for GET /configs/<fingerprint>, in order."""
    return [
        int(line.rsplit('" ', 1)[1].split()[0])
        for line in log.read_text().splitlines()
        if f'"GET /api/v1/configs/{fingerprint}?' in line
    ]


@pytest.mark.slow
def test_the_fetched_config_reproduces_the_tuned_artifact(tuned: Tuned, tmp_path: Path) -> None:
    config = httpx.get(f"{tuned.url}/api/v1/models/{tuned.model_id}/config").json()
    assert [step["pass"] for step in config["passes"]] == ["remove_dropout"], config["whole_model"]

    module, warned = load_recording(tuned.model, server=tuned.url, cache_dir=tmp_path)
    assert warned == []
    art = httpx.get(f"{tuned.url}/api/v1/models/{tuned.model_id}/artifact?device=cpu")
    assert art.status_code == 200
    (tmp_path / "tuned.pt2").write_bytes(art.content)
    artifact = torch.export.load(tmp_path / "tuned.pt2").module()
    assert dropouts_in(module) == dropouts_in(artifact) == 0
    assert dropouts_in(load_program(tuned.model).module()) == 48
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(2, 8)
            torch.testing.assert_close(module(x), artifact(x), rtol=0, atol=0)
            torch.testing.assert_close(module(x), tuned.module(x))


@pytest.mark.slow
def test_a_second_load_costs_a_304_and_uses_the_cached_config(tuned: Tuned, tmp_path: Path) -> None:
    before = len(config_requests(tuned.log, tuned.fingerprint))
    for _ in range(2):
        module, warned = load_recording(tuned.model, server=tuned.url, cache_dir=tmp_path)
        assert warned == [] and dropouts_in(module) == 0
    assert wait_for(
        lambda: config_requests(tuned.log, tuned.fingerprint)[before:] == [200, 304],
        5,
        "the service to log one 200 and then one 304",
        0.1,
    )


@pytest.mark.slow
def test_fetch_command_writes_the_config_for_scripts(tuned: Tuned, tmp_path: Path) -> None:
    out = tmp_path / "config.json"
    command = ["fetch", str(tuned.model), "--server", tuned.url, "-o", str(out)]
    run = subprocess.run(
        [sys.executable, "-m", "fxtune_cli", *command],
        cwd=REPO,
        env=tuned.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    expected = httpx.get(f"{tuned.url}/api/v1/configs/{tuned.fingerprint}").json()
    assert json.loads(out.read_text()) == expected

    missing = CliRunner().invoke(app, ["fetch", str(tuned.reshaped), "--server", tuned.url])
    assert missing.exit_code == 2 and "no tuned config for fingerprint" in missing.output


@pytest.mark.slow
@pytest.mark.parametrize("which", ["reshaped", "stranger"])
def test_a_model_without_a_config_runs_untuned_with_one_warning(
    tuned: Tuned, tmp_path: Path, which: str
) -> None:
    path = getattr(tuned, which)
    module, warned = load_recording(path, server=tuned.url, cache_dir=tmp_path)
    assert len(warned) == 1 and "no tuned config for fingerprint" in warned[0], warned
    assert model_fingerprint(load_program(path)) in warned[0]
    reference = load_program(path).module()
    x = load_program(path).example_inputs[0][0]
    assert str(module.graph) == str(reference.graph)
    torch.testing.assert_close(module(x), reference(x))


def serve_pid(url: str) -> int:
    port = url.rsplit(":", 1)[1]
    for pid in children(os.getpid()):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if b"serve" in argv and port.encode() in argv:
            return pid
    raise AssertionError(f"no serve process on port {port}")


@pytest.mark.slow
def test_a_stalled_then_stopped_service_leaves_the_cached_config(
    tuned: Tuned, tmp_path: Path
) -> None:
    """A second service on the same data: stall it (SIGSTOP), then stop it for good."""
    cache, empty = tmp_path / "cache", tmp_path / "empty"
    with serve_process(tuned.env, tmp_path / "serve2.log") as url:
        module, warned = load_recording(tuned.model, server=url, cache_dir=cache)
        assert warned == [] and dropouts_in(module) == 0
        pid = serve_pid(url)
        os.kill(pid, signal.SIGSTOP)  # still accepts connections, answers nothing
        try:
            started = time.monotonic()
            module, warned = load_recording(tuned.model, server=url, cache_dir=cache, timeout=1)
            elapsed = time.monotonic() - started
            untuned, untuned_warned = load_recording(
                tuned.model, server=url, cache_dir=empty, timeout=1
            )
        finally:
            os.kill(pid, signal.SIGCONT)
        assert elapsed < 4, f"a 1 s timeout took {elapsed:.1f} s"
        assert dropouts_in(module) == 0
        assert len(warned) == 1 and "cached config" in warned[0] and "timed out" in warned[0]
        assert dropouts_in(untuned) == 48
        assert len(untuned_warned) == 1 and "untuned" in untuned_warned[0]

    module, warned = load_recording(tuned.model, server=url, cache_dir=cache)
    assert dropouts_in(module) == 0
    assert len(warned) == 1 and "cached config" in warned[0] and "unreachable" in warned[0]
    x = torch.randn(2, 8)
    torch.testing.assert_close(module(x), tuned.module(x))


class Towers(nn.Module):
    """Eight parallel linears on one input: `fuse_horizontal_linear` fires, also in training."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList(nn.Linear(16, 16) for _ in range(8))
        self.head = nn.Linear(128, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([torch.relu(t(x)) for t in self.towers], dim=1))


def sgd_losses(module: nn.Module, batches: list[torch.Tensor]) -> list[float]:
    optimizer = torch.optim.SGD(module.parameters(), lr=0.05)
    losses = []
    for x in batches:
        optimizer.zero_grad()
        loss = module(x).square().mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.slow
def test_a_training_job_is_tuned_served_by_mode_and_trains_like_the_original(
    tuned: Tuned, tmp_path: Path
) -> None:
    """Issue 12 as a user runs it: `fxtune submit --mode train`, the worker tunes the training
    step, the config is served under mode=train beside inference configs, and the deployment's
    `load_tuned(..., mode="train")` trains with the original's losses and state_dict."""
    torch.manual_seed(1)
    model = tmp_path / "towers_train.pt2"
    program = torch.export.export(Towers().train(), (torch.randn(32, 16),), strict=False)
    torch.export.save(program, model)
    submit = [sys.executable, "-m", "fxtune_cli", "submit", str(model), "--server", tuned.url]
    done = subprocess.run(
        [*submit, "--mode", "train", "--optimizer", "sgd", "--budget-s", "6", "--wait"],
        env=tuned.env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mode=train" in done.stdout

    fetched = CliRunner().invoke(
        app, ["fetch", str(model), "--server", tuned.url, "--mode", "train"]
    )
    assert fetched.exit_code == 0, fetched.output
    config = json.loads(fetched.stdout)
    assert config["mode"] == "train" and config["training"]["optimizer"] == "sgd"
    names = [c["name"] for c in config["candidates"]]
    assert "eager + fuse_horizontal_linear" in names, names
    inference = CliRunner().invoke(app, ["fetch", str(model), "--server", tuned.url])
    assert inference.exit_code == 2  # tuned for training only: no inference config to serve
    assert httpx.get(f"{tuned.url}/api/v1/models/{tuned.model_id}/config").status_code == 200

    module, warned = load_recording(model, server=tuned.url, cache_dir=tmp_path, mode="train")
    assert not [w for w in warned if "untuned" in w], warned
    original = load_program(model).module()
    assert module.state_dict().keys() == original.state_dict().keys()
    batches = [torch.randn(32, 16) for _ in range(5)]
    torch.testing.assert_close(
        sgd_losses(module, batches), sgd_losses(original, batches), rtol=1e-4, atol=1e-6
    )
    for name, value in module.state_dict().items():
        torch.testing.assert_close(value, original.state_dict()[name], rtol=1e-4, atol=1e-6)
