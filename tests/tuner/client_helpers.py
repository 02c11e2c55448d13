"""The deployment client's test doubles: a config service on loopback whose answers each test
sets, valid configs for small programs, and `load_tuned` with its warnings recorded."""

from __future__ import annotations

import contextlib
import json
import threading
import warnings
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from torch import nn
from torch.export import ExportedProgram

from tests.service.fakes import config as fake_config
from tuner.deploy.client import FxtuneClientWarning, load_tuned
from tuner.graph.capture import export_module, to_graph_module
from tuner.graph.fingerprint import model_fingerprint
from tuner.passes import get_pass


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.drop = nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.relu(self.fc(x)))


def dropped_program() -> ExportedProgram:
    torch.manual_seed(0)
    return export_module(Dropped().eval(), (torch.randn(2, 6),))


def tuned_config(program: ExportedProgram, *passes: str, **fields: Any) -> dict[str, Any]:
    """A valid config that rewrites every site of `passes` (found as the tuner finds them)."""
    gm = to_graph_module(program)
    steps = [{"pass": p, "sites": [s.id for s in get_pass(p).find_sites(gm)]} for p in passes]
    assert all(step["sites"] for step in steps), "a pass under test found no site"
    doc = fake_config(model_fingerprint(program))
    doc["passes"] = doc["whole_model"]["passes"] = steps
    return {**doc, **fields}


def load_recording(*args: Any, **kwargs: Any) -> tuple[nn.Module, list[str]]:
    """load_tuned, and the messages of the FxtuneClientWarnings it gave (each one counted)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = load_tuned(*args, **kwargs)
    return module, [str(w.message) for w in caught if w.category is FxtuneClientWarning]


class FakeService:
    """GET /api/v1/configs/<fingerprint> the way the service answers it (ETag, 304, 404), or
    `reply` (status, body) when a test sets one. Every request's path and headers are kept."""

    def __init__(self) -> None:
        self.configs: dict[str, dict[str, Any]] = {}
        self.runtime_files: dict[str, bytes] = {}  # by sha256: GET .../configs/<fp>/runtime
        self.reply: tuple[int, bytes] | None = None
        self.seen: list[tuple[str, dict[str, str]]] = []

    def answer(self, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        self.seen.append((path, headers))
        if self.reply is not None:
            return self.reply[0], {"ETag": '"bad"'}, self.reply[1]
        route, _, query = path.partition("?")
        if route.endswith("/runtime"):
            digest = dict(p.split("=", 1) for p in query.split("&") if "=" in p).get("sha256")
            body = self.runtime_files.get(digest or "")
            return (200, {}, body) if body is not None else (404, {}, b"{}")
        fingerprint = path.split("?")[0].rsplit("/", 1)[-1]
        config = self.configs.get(fingerprint)
        if config is None:
            return 404, {}, json.dumps({"detail": "no tuned config"}).encode()
        etag = f'"{hash(json.dumps(config, sort_keys=True)) & 0xFFFFFF:x}"'
        if headers.get("if-none-match") == etag:
            return 304, {"ETag": etag}, b""
        return 200, {"ETag": etag}, json.dumps(config).encode()

    def conditional(self) -> list[str | None]:
        return [headers.get("if-none-match") for _, headers in self.seen]


@contextlib.contextmanager
def fake_config_service() -> Iterator[tuple[str, FakeService]]:
    """A FakeService on loopback: its URL and the fake."""
    fake = FakeService()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, extra, body = fake.answer(self.path, headers)
            self.send_response(status)
            for name, value in extra.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", fake
    finally:
        server.shutdown()
        server.server_close()
