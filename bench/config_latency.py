"""Config-fetch latency on loopback: what a deployment pays to look up its tuned config.

Starts `fxtune serve --embedded-worker` (SQLite in a temp dir), tunes one tiny
model for real, then sends a bounded number of GET /api/v1/configs/{fingerprint} requests from
a few concurrent keep-alive clients, with and without If-None-Match, and reports p50/p99.

    python -m bench.config_latency [--requests 2000] [--concurrency 1 8 32] [--label after]

Each run is kept in bench/out/config_latency.json under its label, so a "before" and an "after"
run on the same machine sit side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import torch

from examples.demo import service

OUT = Path(__file__).resolve().parent / "out"


def tiny_model(path: Path) -> Path:
    module = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    torch.export.save(torch.export.export(module.eval(), (torch.randn(4, 32),)), path)
    return path


def tuned_fingerprint(url: str, model: Path) -> str:
    with httpx.Client(base_url=url, timeout=60) as http, model.open("rb") as f:
        body = http.post(
            "/api/v1/models", files={"file": f}, data={"tune": "true", "budget_s": "2"}
        ).json()
        job_id = body["job"]["id"]
        deadline = time.monotonic() + 300
        while (job := http.get(f"/api/v1/jobs/{job_id}").json())["status"] not in (
            "succeeded",
            "failed",
        ):
            if time.monotonic() > deadline:
                raise RuntimeError("tuning the bench model took too long")
            time.sleep(0.5)
        if job["status"] != "succeeded":
            raise RuntimeError(f"tuning failed: {job['error']}")
        return http.get(f"/api/v1/models/{body['id']}").json()["fingerprint"]


def hammer(url: str, path: str, requests: int, concurrency: int, etag: str | None) -> list[float]:
    """`requests` GETs split over `concurrency` keep-alive clients; returns latencies (s)."""
    latencies: list[float] = []
    lock = threading.Lock()
    headers = {"If-None-Match": etag} if etag else {}
    expected = 304 if etag else 200

    def client(n: int) -> None:
        mine = []
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            http.get(path)  # connect outside the measurement
            for _ in range(n):
                start = time.perf_counter()
                resp = http.get(path)
                mine.append(time.perf_counter() - start)
                if resp.status_code != expected:
                    raise RuntimeError(f"unexpected {resp.status_code}")
        with lock:
            latencies.extend(mine)

    share = [requests // concurrency + (i < requests % concurrency) for i in range(concurrency)]
    threads = [threading.Thread(target=client, args=(n,)) for n in share]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def summary(name: str, latencies: list[float], wall_s: float) -> dict[str, Any]:
    qs = statistics.quantiles(latencies, n=100)
    return {
        "case": name,
        "requests": len(latencies),
        "p50_ms": qs[49] * 1e3,
        "p99_ms": qs[98] * 1e3,
        "max_ms": max(latencies) * 1e3,
        "throughput_rps": len(latencies) / wall_s,
    }


def save(label: str, run: dict[str, Any]) -> None:
    """Keep every labelled run (older single-run files are dropped)."""
    OUT.mkdir(exist_ok=True)
    path = OUT / "config_latency.json"
    runs: dict[str, Any] = {}
    if path.is_file():
        runs = json.loads(path.read_text()).get("runs", {})
    runs[label] = run
    path.write_text(json.dumps({"runs": runs}, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="config-fetch latency on loopback")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--label", default="latest", help="Name this run is kept under")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fxtune-bench-") as tmp:
        root = Path(tmp)
        with service(root / "data", root / "serve.log") as url:
            fingerprint = tuned_fingerprint(url, tiny_model(root / "m.pt2"))
            path = f"/api/v1/configs/{fingerprint}?device=cpu"
            etag = httpx.get(url + path).headers["etag"]
            rows = []
            for clients in args.concurrency:
                for name, tag in (("200 full config", None), ("304 If-None-Match", etag)):
                    start = time.perf_counter()
                    lat = hammer(url, path, args.requests, clients, tag)
                    row = summary(name, lat, time.perf_counter() - start)
                    rows.append({"clients": clients, **row})
    run = {"database": "sqlite", "cpus": os.cpu_count(), "cases": rows}
    save(args.label, run)
    for r in rows:
        print(
            f"{r['clients']:>3} clients  {r['case']:<20} n={r['requests']:<6} "
            f"p50 {r['p50_ms']:6.2f} ms  "
            f"p99 {r['p99_ms']:6.2f} ms  max {r['max_ms']:6.1f} ms  "
            f"{r['throughput_rps']:6.0f} req/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
