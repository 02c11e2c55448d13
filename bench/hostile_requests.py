"""Hostile request bodies against a real `fxtune serve` (uvicorn): status, time, peak memory.

    python -m bench.hostile_requests [--repo PATH] [--label before|after]

For each case a fresh service process is started (SQLite in a temp dir, a user and a worker
token), its resident memory is sampled every 20 ms while one raw-socket client sends the body,
and the client stops sending as soon as the service answers (as curl does). `--repo` runs the
service from another checkout (e.g. the main branch, for a "before" figure). Results are kept in
bench/out/hostile_requests.json under the label.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from service.launch import serve_process

MB = 1024 * 1024
OUT = Path(__file__).resolve().parent / "out" / "hostile_requests.json"
USER, WORKER = "user-token-for-bench", "worker-token-for-bench"


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    token: str | None
    body_mb: int
    chunked: bool = False
    prefix: bytes = b'{"worker_id": "'
    suffix: bytes = b'", "device": "cpu"}'


CASES = (
    Case("claim, no token, 200 MB", "/api/v1/jobs/claim", None, 200),
    Case("claim, no token, 200 MB chunked", "/api/v1/jobs/claim", None, 200, chunked=True),
    Case("claim, worker token, 200 MB chunked", "/api/v1/jobs/claim", WORKER, 200, chunked=True),
    Case(
        "create job, user token, 100 MB extra key",
        "/api/v1/models/1/jobs",
        USER,
        100,
        prefix=b'{"device": "cpu", "pad": "',
        suffix=b'"}',
    ),
)


@dataclass
class Result:
    case: str
    status: int | None
    seconds: float
    sent_mb: float
    reply_bytes: int
    rss_before_mb: float
    rss_peak_mb: float
    note: str = ""


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def service_pid(port: int) -> int:
    """The process listening on `port` (the uvicorn server), found through /proc/net/tcp."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(parts[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    return int(proc.name)
        except OSError:
            continue
    raise RuntimeError(f"no process listens on port {port}")


class Sampler(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.done = pid, rss_mb(pid), threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            self.peak = max(self.peak, rss_mb(self.pid))
            time.sleep(0.02)


def body_chunks(case: Case) -> Iterator[bytes]:
    yield case.prefix
    chunk = b"a" * MB
    for _ in range(case.body_mb):
        yield chunk
    yield case.suffix


def send(port: int, case: Case) -> tuple[int | None, float, float, int, str]:
    """Send the request; stop sending once a reply arrives. (status, s, MB sent, reply, note)"""
    length = sum(len(c) for c in body_chunks(case))
    head = [f"POST {case.path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    head.append("Content-Type: application/json")
    head.append("Transfer-Encoding: chunked" if case.chunked else f"Content-Length: {length}")
    if case.token:
        head.append(f"Authorization: Bearer {case.token}")
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(300)
    started = time.monotonic()
    sent, note = 0, ""
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        for chunk in body_chunks(case):
            if select.select([sock], [], [], 0)[0]:
                note = "answered before the body was sent"
                break
            data = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" if case.chunked else chunk
            sock.sendall(data)
            sent += len(chunk)
        else:
            if case.chunked:
                sock.sendall(b"0\r\n\r\n")
    except OSError as exc:
        note = f"send stopped: {type(exc).__name__}"
    reply = b""
    try:
        while True:
            got = sock.recv(1 << 20)
            if not got:
                break
            reply += got
            if _complete(reply):
                break
    except OSError as exc:
        note += f"; recv: {type(exc).__name__}"
    seconds = time.monotonic() - started
    sock.close()
    status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else None
    return status, seconds, sent / MB, len(reply), note.strip("; ")


def _complete(reply: bytes) -> bool:
    head, sep, body = reply.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def run_case(case: Case, repo: Path, root: Path) -> Result:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXTUNE_")}
    env.update(
        FXTUNE_DATA_DIR=str(root / "data"),
        FXTUNE_API_TOKEN=USER,
        FXTUNE_WORKER_TOKEN=WORKER,
        PYTHONPATH=str(repo),
    )
    with serve_process(env, root / "serve.log") as url:  # PYTHONPATH names the checkout
        port = int(url.rsplit(":", 1)[1])
        pid = service_pid(port)
        time.sleep(1.0)  # let start-up allocations settle
        before = rss_mb(pid)
        sampler = Sampler(pid)
        sampler.start()
        status, seconds, sent, reply, note = send(port, case)
        time.sleep(0.5)
        sampler.done.set()
        sampler.join()
    return Result(case.name, status, seconds, sent, reply, before, sampler.peak, note)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--label", default="after")
    args = parser.parse_args(argv)
    results = []
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="fxtune-hostile-") as tmp:
            result = run_case(case, args.repo.resolve(), Path(tmp))
        print(json.dumps(asdict(result)), flush=True)
        results.append(asdict(result))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    kept = json.loads(OUT.read_text()) if OUT.is_file() else {}
    kept[args.label] = {"repo": str(args.repo), "python": sys.version.split()[0], "runs": results}
    OUT.write_text(json.dumps(kept, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
