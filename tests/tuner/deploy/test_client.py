"""The deployment client against a real HTTP server on loopback whose answers each test sets.

tests/e2e/test_client_e2e.py runs it against the real service and a real worker; here are the
edge cases a real service rarely produces (malformed configs, errors, slow and trickling peers).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from tests.passes_helpers import Ranker, ranker_inputs
from tests.tuner.client_helpers import (
    Dropped,
    FakeService,
    dropped_program,
    load_recording,
    tuned_config,
)
from tuner.cli import app
from tuner.contract.device import Device
from tuner.contract.errors import ArtifactFormatError
from tuner.deploy.client import (
    CheckedInputs,
    ConfigCache,
    PackedInputs,
    fetch_config,
    load_tuned,
    measured_elsewhere,
)
from tuner.graph.capture import export_module, save_program
from tuner.graph.fingerprint import model_fingerprint
from tuner.host.hardware import describe

REPO = Path(__file__).resolve().parents[3]


def has_dropout(module: nn.Module) -> bool:
    if isinstance(module, CheckedInputs):  # load_tuned's input check around the tuned graph
        module = module.tuned
    assert isinstance(module, torch.fx.GraphModule)
    return any("dropout" in str(n.target) for n in module.graph.nodes)


@contextlib.contextmanager
def stalling_server(trickle: bool) -> Iterator[str]:
    """Accepts and then never finishes an answer: silent, or one header byte every 0.1 s."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        give_up = time.monotonic() + 10  # a client without a deadline fails, not hangs
        with conn:
            if trickle:
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                while not stop.wait(0.1) and time.monotonic() < give_up:
                    conn.sendall(b"X-Slow: x\r\n")
            else:
                stop.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


class Flood:
    """A server whose config reply is `total` bytes of JSON-ish padding, declared or chunked;
    `sent` counts what it managed to send before the client hung up."""

    def __init__(self, total: int, declared: bool) -> None:
        self.total, self.declared, self.sent = total, declared, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.done = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(65536)
            length = (
                f"Content-Length: {self.total}" if self.declared else "Transfer-Encoding: chunked"
            )
            conn.sendall(f"HTTP/1.1 200 OK\r\n{length}\r\nConnection: close\r\n\r\n".encode())
            chunk = b"a" * (1 << 20)
            try:
                while self.sent < self.total:
                    frame = chunk if self.declared else b"100000\r\n" + chunk + b"\r\n"
                    conn.sendall(frame)
                    self.sent += len(chunk)
                if not self.declared:
                    conn.sendall(b"0\r\n\r\n")
            except OSError:
                pass
        self.done.set()

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "declared"])
def test_an_oversize_config_reply_is_not_read_past_the_cap(declared: bool, tmp_path: Path) -> None:
    total = 300 * 1024 * 1024
    flood = Flood(total, declared)
    try:
        module, warned = load_recording(dropped_program(), server=flood.url, cache_dir=tmp_path)
        assert flood.done.wait(30)
    finally:
        flood.close()
    assert has_dropout(module)  # untuned
    assert len(warned) == 1 and "larger than the 8388608-byte cap" in warned[0], warned
    assert flood.sent < 64 * 1024 * 1024  # the client stopped reading: the server could not go on


def test_the_cap_is_what_stops_the_read(tmp_path: Path) -> None:
    """The control: with a cap above the reply, the same flood is read to its end (and then
    refused as not a config)."""
    flood = Flood(40 * 1024 * 1024, declared=False)
    try:
        config, reason = fetch_config(
            "ab" * 16, server=flood.url, cache_dir=tmp_path, max_bytes=64 * 1024 * 1024
        )
        assert flood.done.wait(30)
    finally:
        flood.close()
    assert config is None and "unusable config" in reason
    assert flood.sent == 40 * 1024 * 1024


def test_fetch_refuses_an_oversize_reply_with_a_clear_error(tmp_path: Path) -> None:
    flood = Flood(300 * 1024 * 1024, declared=False)
    try:
        result = CliRunner().invoke(app, ["fetch", "ab" * 16, "--server", flood.url])
    finally:
        flood.close()
    assert result.exit_code == 2 and "larger than the 8388608-byte cap" in result.output


def dead_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_applies_the_fetched_config_then_revalidates_with_its_etag(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fake.configs[model_fingerprint(program)] = tuned_config(program, "remove_dropout")
    x = torch.randn(2, 6)
    for _ in range(2):
        module, warned = load_recording(program, server=url, cache_dir=tmp_path)
        assert warned == []
        assert not has_dropout(module) and has_dropout(program.module())
        torch.testing.assert_close(module(x), program.module()(x))
    first, second = fake.conditional()
    assert first is None and second is not None  # the second request was conditional: a 304


def test_a_cached_config_serves_while_the_server_is_down(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fake.configs[model_fingerprint(program)] = tuned_config(program, "remove_dropout")
    load_recording(program, server=url, cache_dir=tmp_path)
    module, warned = load_recording(program, server=dead_url(), cache_dir=tmp_path)
    assert not has_dropout(module)
    assert len(warned) == 1 and "using the cached config" in warned[0]
    assert "unreachable" in warned[0]


def test_no_config_runs_untuned_and_forgets_a_withdrawn_one(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fingerprint = model_fingerprint(program)
    fake.configs[fingerprint] = tuned_config(program, "remove_dropout")
    load_recording(program, server=url, cache_dir=tmp_path)
    assert ConfigCache(tmp_path).load(fingerprint, "cpu")[1] is not None
    del fake.configs[fingerprint]
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert has_dropout(module)
    assert len(warned) == 1 and f"no tuned config for fingerprint {fingerprint}" in warned[0]
    assert ConfigCache(tmp_path).load(fingerprint, "cpu") == (None, None)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda c: b"{not json", "unusable config"),
        (lambda c: json.dumps({**c, "passes": "everything"}).encode(), "malformed config"),
        (lambda c: json.dumps({**c, "model_fingerprint": "ab" * 16}).encode(), "is for"),
        (lambda c: json.dumps({**c, "schema_version": 99}).encode(), "schema version 99"),
    ],
    ids=["not-json", "bad-field", "other-fingerprint", "newer-schema"],
)
def test_an_unusable_config_runs_untuned_and_is_not_cached(
    config_service: tuple[str, FakeService], tmp_path: Path, change: Any, says: str
) -> None:
    url, fake = config_service
    program = dropped_program()
    fake.reply = (200, change(tuned_config(program, "remove_dropout")))
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert has_dropout(module)
    assert len(warned) == 1 and says in warned[0], warned
    assert not list(tmp_path.glob("*"))


@pytest.mark.parametrize(
    ("steps", "says"),
    [
        ([{"pass": "no_such_pass", "sites": ["abc"]}], "unknown pass 'no_such_pass'"),
        ([{"pass": "remove_dropout", "sites": ["0123456789abcdef"]}], "are not in this model"),
    ],
    ids=["unknown-pass", "missing-site"],
)
def test_a_config_that_does_not_replay_runs_untuned(
    config_service: tuple[str, FakeService], tmp_path: Path, steps: list[dict[str, Any]], says: str
) -> None:
    url, fake = config_service
    program = dropped_program()
    fake.configs[model_fingerprint(program)] = tuned_config(program, passes=steps)
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert has_dropout(module)
    assert len(warned) == 1 and says in warned[0], warned


def test_server_errors_fall_back_to_the_cache_or_run_untuned(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fake.reply = (403, json.dumps({"detail": "token wrong"}).encode())
    module, warned = load_recording(program, server=url, cache_dir=tmp_path, token="t0")
    assert has_dropout(module)
    assert len(warned) == 1 and "answered 403: token wrong" in warned[0]
    assert fake.seen[-1][1]["authorization"] == "Bearer t0"

    fake.reply = None
    fake.configs[model_fingerprint(program)] = tuned_config(program, "remove_dropout")
    load_recording(program, server=url, cache_dir=tmp_path)
    fake.reply = (500, b"oops")
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert not has_dropout(module)
    assert len(warned) == 1 and "using the cached config (server" in warned[0]


@pytest.mark.serial
@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_a_stalling_server_costs_at_most_the_timeout(trickle: bool, tmp_path: Path) -> None:
    program = dropped_program()
    with stalling_server(trickle) as url:
        started = time.monotonic()
        config, reason = fetch_config(
            model_fingerprint(program), server=url, timeout=0.5, cache_dir=tmp_path
        )
        elapsed = time.monotonic() - started
    assert config is None and "timed out" in reason
    assert elapsed < 1.5, f"took {elapsed:.1f}s with a 0.5 s timeout"


def test_an_unreachable_server_runs_untuned_with_one_warning(tmp_path: Path) -> None:
    module, warned = load_recording(dropped_program(), server=dead_url(), cache_dir=tmp_path)
    assert has_dropout(module)
    assert len(warned) == 1 and "unreachable" in warned[0]


def test_an_unwritable_cache_still_gives_the_tuned_module(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fake.configs[model_fingerprint(program)] = tuned_config(program, "remove_dropout")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    module, warned = load_recording(program, server=url, cache_dir=blocker / "cache")
    assert not has_dropout(module) and warned == []


def test_a_config_measured_on_other_threads_is_applied_and_logged(
    config_service: tuple[str, FakeService], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, fake = config_service
    program = dropped_program()
    here = describe(Device.parse("cpu"))
    elsewhere = {**here, "threads": here["threads"] + 1}
    fake.configs[model_fingerprint(program)] = tuned_config(
        program, "remove_dropout", hardware=elsewhere
    )
    with caplog.at_level("WARNING", logger="tuner.deploy.client"):
        module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert not has_dropout(module) and warned == []  # tuned and correct: no fallback warning
    said = [r.getMessage() for r in caplog.records if "measured elsewhere" in r.getMessage()]
    assert len(said) == 1, caplog.records
    assert f"threads {elsewhere['threads']} (here {here['threads']})" in said[0]
    assert measured_elsewhere(here, dict(here)) is None
    gpu = {"device": "cuda:0", "name": "NVIDIA H200", "torch": "2.13.0", "threads": 16}
    assert measured_elsewhere(gpu, {**gpu, "threads": 4}) is None  # a GPU's kernels: no threads
    assert "torch 2.13.0 (here 2.11.0)" in (
        measured_elsewhere(gpu, {**gpu, "torch": "2.11.0"}) or ""
    )


def test_a_damaged_cache_entry_is_ignored(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fingerprint = model_fingerprint(program)
    fake.configs[fingerprint] = tuned_config(program, "remove_dropout")
    (tmp_path / f"{fingerprint}-cpu.json").write_text('{"etag": "x", "config": {"passes": 1}}')
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert not has_dropout(module) and warned == []
    assert fake.conditional() == [None]  # no If-None-Match for an entry that did not validate


def test_an_eager_module_is_exported_first_or_returned_as_it_is(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fake.configs[model_fingerprint(program)] = tuned_config(program, "remove_dropout")
    torch.manual_seed(0)
    eager = Dropped().eval()
    x = torch.randn(2, 6)
    module, warned = load_recording(eager, server=url, cache_dir=tmp_path, example_inputs=(x,))
    assert warned == [] and not has_dropout(module)
    torch.testing.assert_close(module(x), eager(x))
    same, warned = load_recording(eager, server=url, cache_dir=tmp_path)
    assert same is eager and len(warned) == 1 and "example_inputs" in warned[0]


def test_a_file_that_is_no_program_raises(tmp_path: Path) -> None:
    path = tmp_path / "model.pt2"
    path.write_bytes(b"not a zip")
    with pytest.raises(ArtifactFormatError):
        load_tuned(path, server=dead_url(), cache_dir=tmp_path)


def test_a_failing_compile_keeps_the_tuned_passes_with_one_warning(
    config_service: tuple[str, FakeService], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, fake = config_service
    program = dropped_program()
    config = tuned_config(program, "remove_dropout", backend="inductor")
    fake.configs[model_fingerprint(program)] = config

    def broken(module: nn.Module) -> Any:
        def run(*_: Any) -> Any:
            raise RuntimeError("no compiler here")

        return run

    monkeypatch.setattr(torch, "compile", broken)
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert not has_dropout(module)
    assert len(warned) == 1 and "inductor failed" in warned[0] and "no compiler" in warned[0]


def test_a_config_that_packs_inputs_keeps_the_original_signature(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    rows, counts = [10, 7, 12], [5, 8, 3]
    ranker = Ranker(rows).eval()
    make = ranker_inputs(rows, counts, bags=4)
    gen = torch.Generator().manual_seed(0)
    program = export_module(ranker, make(gen))
    fake.configs[model_fingerprint(program)] = tuned_config(
        program, "combine_sparse_inputs", changes_inputs=True
    )
    module, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert warned == [] and isinstance(module, CheckedInputs)
    packed = module.tuned
    assert isinstance(packed, PackedInputs)
    placeholders = [n.target for n in packed.tuned.graph.nodes if n.op == "placeholder"]
    assert placeholders == ["sparse_indices", "sparse_offsets", "xs_2"]
    with torch.no_grad():
        for _ in range(3):
            inputs = make(gen)
            torch.testing.assert_close(module(*inputs), ranker(*inputs))


BLOCKED = """
import sys, warnings
from pathlib import Path

SERVICE_ONLY = {
    "fastapi", "sqlalchemy", "alembic", "uvicorn", "starlette", "pydantic_settings", "psycopg",
    "multipart", "jinja2", "service", "worker",
}

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in SERVICE_ONLY:
            raise ImportError(f"{name} is blocked: the client must not need it")

sys.meta_path.insert(0, Blocked())
try:
    import fastapi
except ImportError:
    pass
else:
    raise SystemExit("the import blocker does not work")

from tuner.deploy.client import FxtuneClientWarning, load_tuned

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    module = load_tuned(sys.argv[1], server=sys.argv[2], cache_dir=Path(sys.argv[3]))
assert not [w for w in caught if w.category is FxtuneClientWarning], caught
assert not any("dropout" in str(n.target) for n in module.tuned.graph.nodes)
print("tuned")
"""


def test_the_client_needs_none_of_the_service_dependencies(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fake.configs[model_fingerprint(program)] = tuned_config(program, "remove_dropout")
    path = save_program(program, tmp_path / "model.pt2")
    run = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(path), url, str(tmp_path / "cache")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "tuned"
    assert len(fake.seen) == 1


def test_fetch_command_writes_the_config_or_exits_2(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    program = dropped_program()
    fingerprint = model_fingerprint(program)
    config = tuned_config(program, "remove_dropout")
    fake.configs[fingerprint] = config
    path = save_program(program, tmp_path / "model.pt2")
    runner = CliRunner()
    for target in (fingerprint, str(path)):
        out = tmp_path / target[-8:] / "config.json"
        result = runner.invoke(app, ["fetch", target, "--server", url, "-o", str(out)])
        assert result.exit_code == 0, result.output
        assert json.loads(out.read_text()) == config

    result = runner.invoke(app, ["fetch", fingerprint, "--server", url])
    assert result.exit_code == 0 and json.loads(result.stdout) == config

    for target, server, says in [
        ("ab" * 16, url, "no tuned config for fingerprint"),
        (fingerprint, dead_url(), "unreachable"),
        ("missing.pt2", url, "no such file: missing.pt2"),
        ("not-a-model", url, "neither a fingerprint"),
    ]:
        result = runner.invoke(app, ["fetch", target, "--server", server, "-o", "x.json"])
        assert result.exit_code == 2 and says in result.output, result.output


class TwoHeads(nn.Module):
    """Two linears on one input: fuse_horizontal_linear concatenates their weights."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 4)
        self.b = nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([torch.relu(self.a(x)), torch.tanh(self.b(x))], dim=1)


def _linears(module: nn.Module) -> int:
    assert isinstance(module, torch.fx.GraphModule)
    return sum(n.target is torch.ops.aten.linear.default for n in module.graph.nodes)


def test_a_training_config_gives_a_module_that_trains_as_the_original(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    torch.manual_seed(0)
    program = export_module(TwoHeads().train(), (torch.randn(5, 6),))
    config = tuned_config(program, "fuse_horizontal_linear", mode="train")
    fake.configs[model_fingerprint(program)] = config
    module, warned = load_recording(program, server=url, cache_dir=tmp_path, mode="train")
    assert warned == []
    original = program.module()
    assert list(module.state_dict()) == list(original.state_dict())
    assert _linears(module) == 1 and _linears(original) == 2  # fused: weights cat in the graph
    x = torch.randn(5, 6)
    for m in (module, original):
        m(x).pow(2).mean().backward()
    grads = dict(original.named_parameters())
    for name, p in module.named_parameters():
        torch.testing.assert_close(p.grad, grads[name].grad)
    # A training config is not applied where an inference one is asked for, nor the reverse.
    untuned, warned = load_recording(program, server=url, cache_dir=tmp_path)
    assert len(warned) == 1 and "mode 'train'" in warned[0]
    assert _linears(untuned) == 2


class BakedDevice(nn.Module):
    """`device="cpu"` in forward: export bakes that device into the graph, where moving the
    weights does not reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.relu(self.fc(x))) + torch.arange(3.0, device="cpu")


@pytest.mark.cuda
def test_a_cuda_deployment_moves_the_devices_baked_in_at_export(
    config_service: tuple[str, FakeService], tmp_path: Path
) -> None:
    url, fake = config_service
    torch.manual_seed(0)
    program = export_module(BakedDevice().eval(), (torch.randn(2, 6),))
    fingerprint = model_fingerprint(program)
    fake.configs[fingerprint] = tuned_config(program, "remove_dropout")
    module, warned = load_recording(program, server=url, device="cuda", cache_dir=tmp_path)
    assert warned == []
    assert not has_dropout(module)
    x = torch.randn(2, 6)
    torch.testing.assert_close(module(x.cuda()).cpu(), program.module()(x))
    assert model_fingerprint(program) == fingerprint  # the caller's program stays where it was
