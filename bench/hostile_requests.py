"""Hostile requests against a real `fxtune serve` (uvicorn): status, time, peak memory, CPU.

    python -m bench.hostile_requests [--repo PATH] [--label before|after]
        [--groups bodies,reads,quota,checks] [--hostile N] [--kinds tower,bomb]

For each case a fresh service process is started (SQLite in a temp dir, a user and a worker
token). `bodies`: its resident memory is sampled every 20 ms while one raw-socket client sends a
hostile body, and the client stops sending as soon as the service answers (as curl does).
`reads`: every GET route of its OpenAPI document and the dashboard's pages, asked from loopback
without the token. `quota`: twelve distinct uploads with tune=true from one token (jobs quota 5
here), then a flood of 40 uploads (the per-minute quota). `checks`: N simultaneous uploads of a
power-tower program (a 52-character size expression) and, 0.5 s in, a normal upload that
retries on 503 after its Retry-After; the check children are counted and the service's and their
memory and CPU time sampled. `--repo` runs the service from another checkout (e.g. the main
branch, for a "before" figure). Results are kept in bench/out/hostile_requests.json under the
label, one entry per group.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

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


def service_env(repo: Path, root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXTUNE_")}
    env.update(
        FXTUNE_DATA_DIR=str(root / "data"),
        FXTUNE_API_TOKEN=USER,
        FXTUNE_WORKER_TOKEN=WORKER,
        PYTHONPATH=str(repo),
        **extra,
    )
    return env


def run_case(case: Case, repo: Path, root: Path) -> Result:
    env = service_env(repo, root)
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


# --- reads, quotas and concurrent checks (issue 47) -------------------------------------------

AUTH = {"Authorization": f"Bearer {USER}"}
PUBLIC = frozenset({"/healthz", "/api/v1/healthz", "/openapi.json", "/docs", "/redoc"})
DASHBOARD_PAGES = ("/", "/models/{model_id}")  # outside the OpenAPI document
TOWER = "((((99999999999999999999) ** 64) ** 64) ** 64) ** 64"


def tiny_programs(root: Path, count: int) -> list[Path]:
    """`count` distinct uploads of one tiny program (other zip comments, other bytes)."""
    from tests.service.helpers import tiny_program, variant

    tiny_program(root / "tiny.pt2")
    return [variant(root / "tiny.pt2", root / f"tiny{i}.pt2", f"v{i}") for i in range(count)]


def power_towers(root: Path, count: int) -> list[Path]:
    """A dynamic program one of whose size expressions multiplies the 52-character power tower
    of issue 47 by 0: sympy evaluated it eagerly, holding a core for minutes."""
    from tests import crafted
    from tests.service.helpers import variant

    src = crafted.dynamic_program(root / "dynamic.pt2")
    tower = crafted.first_size_expression(
        src, root / "tower.pt2", lambda expr: f"0 * {TOWER} + {expr}"
    )
    return [variant(tower, root / f"tower{i}.pt2", f"t{i}") for i in range(count)]


def post_upload(http: httpx.Client, path: Path, **data: str) -> tuple[int, float, str | None]:
    started = time.monotonic()
    with path.open("rb") as f:
        resp = http.post("/api/v1/models", files={"file": (path.name, f)}, data=data)
    return resp.status_code, time.monotonic() - started, resp.headers.get("retry-after")


def unauthenticated_reads(repo: Path, _: argparse.Namespace) -> dict[str, Any]:
    """Every GET route (the OpenAPI document's and the dashboard's pages) from loopback, with
    no token, on a service that has one and holds one upload with a job."""
    with tempfile.TemporaryDirectory(prefix="fxtune-reads-") as tmp:
        root = Path(tmp)
        (program,) = tiny_programs(root, 1)
        with serve_process(service_env(repo, root), root / "serve.log") as url:
            http = httpx.Client(base_url=url, timeout=120)
            up = http.post(
                "/api/v1/models",
                files={"file": program.open("rb")},
                data={"tune": "true"},
                headers=AUTH,
            ).json()
            ids = {"model_id": up["id"], "job_id": up["job"]["id"]}
            ids["fingerprint"] = up.get("fingerprint") or "0" * 32
            paths = http.get("/openapi.json").json()["paths"]
            routes = [p for p, ops in paths.items() if "get" in ops and p not in PUBLIC]
            statuses = {}
            for route in [*routes, *DASHBOARD_PAGES]:
                query = "?kind=baseline" if route.endswith("/trace") else ""
                statuses[route] = http.get(route.format(**ids) + query).status_code
            http.close()
    counts: dict[str, int] = {}
    for code in statuses.values():
        counts[str(code)] = counts.get(str(code), 0) + 1
    return {"routes_tried": len(statuses), "counts": counts, "statuses": statuses}


def upload_flood(repo: Path, _: argparse.Namespace) -> dict[str, Any]:
    """Twelve distinct uploads with tune=true (jobs quota 5 here, as a small deployment would
    set it), then 40 uploads at once-a-request speed (the per-minute quota, 30 by default)."""
    with tempfile.TemporaryDirectory(prefix="fxtune-flood-") as tmp:
        root = Path(tmp)
        programs = tiny_programs(root, 12)
        junk = root / "junk.pt2"
        junk.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: refused before any check
        env = service_env(repo, root, FXTUNE_QUOTA_ACTIVE_JOBS="5")
        with serve_process(env, root / "serve.log") as url:
            http = httpx.Client(base_url=url, headers=AUTH, timeout=600)
            started = time.monotonic()
            tuned = [post_upload(http, p, tune="true") for p in programs]
            tuned_s = time.monotonic() - started
            jobs = len(http.get("/api/v1/jobs").json())
            flood = [post_upload(http, junk) for _ in range(40)]
            http.close()
    first = next((r for r in flood if r[0] == 429), None)
    return {
        "tune_uploads": [{"status": c, "s": round(t, 3), "retry_after": r} for c, t, r in tuned],
        "tune_uploads_s": round(tuned_s, 2),
        "jobs_queued": jobs,
        "flood_statuses": [c for c, _, _ in flood],
        "flood_first_429": None
        if first is None
        else {"s": round(first[1], 4), "retry_after": first[2]},
    }


def proc_cpu_s(pid: int) -> tuple[float, float]:
    """(own, waited-for children's) CPU seconds of a process, from /proc/PID/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


class ChildSampler(threading.Thread):
    """Every 50 ms: how many check children the service runs (their Pythons, not bwrap), their
    resident memory together, the service's, and each child's CPU time as last seen (a child
    in a sandbox is not reaped by the service, so its time never reaches the service's
    children's total; the last 50 ms of each are missed)."""

    def __init__(self, service: int) -> None:
        super().__init__(daemon=True)
        self.service, self.done = service, threading.Event()
        self.max_children, self.peak_children_mb, self.peak_service_mb = 0, 0.0, 0.0
        self.child_cpu_s: dict[int, float] = {}
        self.before_s: dict[int, float] = {}  # children already there: their start is not counted

    def run(self) -> None:
        from bench.upload_checks import descendants

        while not self.done.is_set():
            checks = []
            for pid in descendants(self.service):
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if argv[1:3] == [b"-m", b"tuner.checks.inspect"]:
                        checks.append(pid)
            self.max_children = max(self.max_children, len(checks))
            for pid in checks:
                with contextlib.suppress(OSError, IndexError, ValueError):
                    self.child_cpu_s[pid] = proc_cpu_s(pid)[0]
            if not self.before_s:
                self.before_s = dict(self.child_cpu_s) or {0: 0.0}
            with contextlib.suppress(OSError):
                total = sum(rss_mb(pid) for pid in checks)
                self.peak_children_mb = max(self.peak_children_mb, total)
                self.peak_service_mb = max(self.peak_service_mb, rss_mb(self.service))
            time.sleep(0.05)


def zeros_bombs(root: Path, count: int) -> list[Path]:
    """A program allocating 4 TiB in one ATen call: refused by the resource bounds, which only
    the check child computes (it fake-propagates the graph), so each costs a child."""
    from tests import crafted
    from tests.service.helpers import variant

    bomb = crafted.zeros_bomb(root / "bomb.pt2")
    return [variant(bomb, root / f"bomb{i}.pt2", f"b{i}") for i in range(count)]


HOSTILE = {"tower": power_towers, "bomb": zeros_bombs}


def concurrent_checks(repo: Path, args: argparse.Namespace) -> dict[str, Any]:
    kinds = args.kinds.split(",")
    return {kind: burst(repo, args.hostile, HOSTILE[kind]) for kind in kinds}


def burst(repo: Path, hostile: int, build: Callable[[Path, int], list[Path]]) -> dict[str, Any]:
    """`hostile` uploads at once and, 0.5 s in, a normal one that retries after each 503's
    Retry-After; the service's shipped defaults otherwise (one warm checker)."""
    with tempfile.TemporaryDirectory(prefix="fxtune-checks-") as tmp:
        root = Path(tmp)
        towers = build(root, hostile)
        (normal,) = tiny_programs(root, 1)
        with serve_process(service_env(repo, root), root / "serve.log") as url:
            pid = service_pid(int(url.rsplit(":", 1)[1]))
            time.sleep(8.0)  # the warm checker's start (torch import) is not the burst's cost
            cpu_before = proc_cpu_s(pid)
            sampler = ChildSampler(pid)
            sampler.start()
            http = httpx.Client(base_url=url, headers=AUTH, timeout=900)
            barrier = threading.Barrier(hostile + 1)
            answers: list[tuple[int, float, str | None]] = []

            def send(path: Path) -> None:
                barrier.wait(60)
                answers.append(post_upload(http, path))

            threads = [threading.Thread(target=send, args=(p,)) for p in towers]
            for t in threads:
                t.start()
            barrier.wait(60)
            time.sleep(0.5)
            started, attempts = time.monotonic(), []
            while True:
                code, _, retry = post_upload(http, normal)
                attempts.append((code, retry))
                if code != 503 or time.monotonic() - started > 600:
                    break
                time.sleep(float(retry or 1))
            normal_s = time.monotonic() - started
            for t in threads:
                t.join(900)
            sampler.done.set()
            sampler.join()
            cpu_after = proc_cpu_s(pid)
            quota = http.get("/api/v1/quota")
            http.close()
    counts: dict[str, int] = {}
    for code, _, _ in answers:
        counts[str(code)] = counts.get(str(code), 0) + 1
    times = sorted(t for _, t, _ in answers)
    return {
        "hostile": hostile,
        "hostile_statuses": counts,
        "hostile_s_median_max": [round(times[len(times) // 2], 3), round(times[-1], 3)],
        "retry_after": sorted({r for _, _, r in answers if r}),
        "normal_upload": {"s": round(normal_s, 2), "attempts": attempts},
        "max_check_children": sampler.max_children,
        "peak_check_children_rss_mb": round(sampler.peak_children_mb, 1),
        "peak_service_rss_mb": round(sampler.peak_service_mb, 1),
        "service_cpu_s": round(cpu_after[0] - cpu_before[0], 2),
        "check_children_seen": len(sampler.child_cpu_s),
        "check_children_cpu_s": round(
            sum(cpu - sampler.before_s.get(pid, 0.0) for pid, cpu in sampler.child_cpu_s.items()), 2
        ),
        "gate": quota.json().get("checks") if quota.status_code == 200 else None,
    }


def bodies(repo: Path, _: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="fxtune-hostile-") as tmp:
            result = run_case(case, repo, Path(tmp))
        print(json.dumps(asdict(result)), flush=True)
        results.append(asdict(result))
    return results


GROUPS: dict[str, Callable[[Path, argparse.Namespace], Any]] = {
    "bodies": bodies,
    "reads": unauthenticated_reads,
    "quota": upload_flood,
    "checks": concurrent_checks,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--label", default="after")
    parser.add_argument("--groups", default=",".join(GROUPS))
    parser.add_argument("--hostile", type=int, default=20, help="simultaneous uploads (checks)")
    parser.add_argument("--kinds", default=",".join(HOSTILE), help="hostile programs (checks)")
    args = parser.parse_args(argv)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    kept = json.loads(OUT.read_text()) if OUT.is_file() else {}
    entry = kept.setdefault(args.label, {})
    entry.update(repo=str(args.repo), python=sys.version.split()[0])
    for group in args.groups.split(","):
        entry[group] = GROUPS[group](args.repo.resolve(), args)
        if group != "bodies":
            print(json.dumps({group: entry[group]}, indent=1), flush=True)
        OUT.write_text(json.dumps(kept, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
