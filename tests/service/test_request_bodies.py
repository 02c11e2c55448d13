"""Request bodies against a live service: the route's credentials are checked before a byte of
body is read, JSON bodies are capped (declared or chunked) with 413, and error bodies quote at
most a short excerpt of the input."""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterable, Iterator

import pytest

from service.core.config import Settings
from tests.service.helpers import thread_server

USER, WORKER = "user-token", "worker-token"
MB = 1024 * 1024


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    root = tmp_path_factory.mktemp("svc")
    settings = Settings(
        data_dir=root / "data",
        database_url=f"sqlite:///{root / 'db.sqlite'}",
        api_token=USER,
        worker_token=WORKER,
        max_json_kb=1024,
    )
    with thread_server(settings) as (url, _app):
        yield int(url.rsplit(":", 1)[1])


def exchange(
    port: int,
    path: str,
    body: Iterable[bytes],
    *,
    token: str | None = None,
    length: int | None = None,
    content_type: str = "application/json",
) -> tuple[int, bytes, int]:
    """One POST over a raw socket that stops sending once the service answers (as curl does).

    `length` None: chunked. Returns (status, reply body, body bytes sent)."""
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Type: {content_type}"]
    head.append("Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}")
    if token:
        head.append(f"Authorization: Bearer {token}")
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        time.sleep(0.2)  # a service that answers on the headers alone has answered by now
        for chunk in body:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(
                    f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if length is None else chunk
                )
            except OSError:
                break
            sent += len(chunk)
        else:
            if length is None:
                sock.sendall(b"0\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.partition(b"\r\n\r\n")[2]) < _length(reply):
            got = sock.recv(65536)
            if not got:
                break
            reply += got
    head_bytes, _, payload = reply.partition(b"\r\n\r\n")
    return int(head_bytes.split(b" ", 2)[1]), payload, sent


def _length(reply: bytes) -> int:
    for line in reply.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


def padded(prefix: bytes, mb: float, suffix: bytes) -> Iterator[bytes]:
    yield prefix
    for _ in range(int(mb * 16)):
        yield b"a" * (MB // 16)
    yield suffix


CLAIM = (b'{"worker_id": "w", "device": "cpu", "hardware": {"pad": "', b'"}}')


def test_a_small_claim_works_chunked_or_not(port: int) -> None:
    """The control for the refusals below: the route takes a proper body either way."""
    body = b'{"worker_id": "w", "device": "cpu"}'
    assert exchange(port, "/api/v1/jobs/claim", [body], token=WORKER, length=len(body))[0] == 204
    assert exchange(port, "/api/v1/jobs/claim", [body], token=WORKER)[0] == 204
    under = list(padded(*CLAIM[:1], 0.5, CLAIM[1]))
    assert exchange(port, "/api/v1/jobs/claim", under, token=WORKER)[0] == 204


@pytest.mark.parametrize("chunked", [False, True])
def test_no_token_is_refused_before_the_body_is_read(port: int, chunked: bool) -> None:
    body = (
        list(padded(*CLAIM[:1], 200, CLAIM[1]))
        if not chunked
        else padded(*CLAIM[:1], 200, CLAIM[1])
    )
    length = None if chunked else 200 * MB + len(CLAIM[0]) + len(CLAIM[1])
    started = time.monotonic()
    status, reply, sent = exchange(port, "/api/v1/jobs/claim", body, length=length)
    assert status == 401 and "worker bearer token" in json.loads(reply)["detail"]
    assert sent < 8 * MB  # answered on the headers: the client stopped sending at once
    assert time.monotonic() - started < 5


def test_the_user_token_on_a_worker_route_is_refused_before_the_body(port: int) -> None:
    status, _, sent = exchange(
        port, "/api/v1/jobs/claim", padded(*CLAIM[:1], 50, CLAIM[1]), token=USER, length=50 * MB
    )
    assert status == 403 and sent < 8 * MB


def test_a_declared_oversize_json_body_is_413_before_it_is_read(port: int) -> None:
    prefix, suffix = b'{"device": "cpu", "pad": "', b'"}'
    status, reply, sent = exchange(
        port, "/api/v1/models/1/jobs", padded(prefix, 100, suffix), token=USER, length=100 * MB
    )
    assert status == 413 and "1024 KiB" in json.loads(reply)["detail"]
    assert sent < 8 * MB


def test_a_chunked_oversize_json_body_is_cut_off_with_413(port: int) -> None:
    status, reply, sent = exchange(
        port, "/api/v1/jobs/claim", padded(*CLAIM[:1], 200, CLAIM[1]), token=WORKER
    )
    assert status == 413, reply
    assert sent < 40 * MB  # socket buffers hold a little more than the 1 MiB that was read


def test_an_upload_without_a_token_is_refused_before_its_body(port: int) -> None:
    status, _, sent = exchange(
        port,
        "/api/v1/models",
        padded(b"--b\r\n", 100, b"--b--\r\n"),
        length=100 * MB,
        content_type="multipart/form-data; boundary=b",
    )
    assert status == 401 and sent < 8 * MB


def test_a_422_quotes_only_an_excerpt_of_the_input(port: int) -> None:
    prefix, suffix = b'{"device": "cpu", "pad": "', b'"}'
    body = b"".join(padded(prefix, 0.9, suffix))
    status, reply, _ = exchange(port, "/api/v1/models/1/jobs", [body], token=USER, length=len(body))
    assert status == 422
    assert len(reply) < 2000, len(reply)
    error = json.loads(reply)["detail"][0]
    assert error["loc"] == ["body", "pad"] and error["type"] == "extra_forbidden"
    assert (
        error["input"].startswith("aaaa")
        and f"({len(body) - len(prefix) - len(suffix)} chars)" in error["input"]
    )


def test_long_keys_and_many_errors_are_bounded_too(port: int) -> None:
    fields = {f"k{'x' * 5000}{i}": i for i in range(100)}
    body = json.dumps({"device": "cpu", **fields}).encode()
    status, reply, _ = exchange(port, "/api/v1/models/1/jobs", [body], token=USER, length=len(body))
    assert status == 422 and len(reply) < 10_000, len(reply)
    detail = json.loads(reply)["detail"]
    assert detail[-1] == {"type": "truncated", "loc": [], "msg": "100 errors in all"}
