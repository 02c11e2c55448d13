"""What checking uploads in a sandboxed child costs, and what the hostile programs get.

`python -m bench.upload_checks [--out bench/out/upload_checks.json]` starts a real `fxtune serve`
and uploads (a) fresh ~50 MB programs (an MLP of 12.6M float32 parameters, new weights each
time, so nothing is deduplicated) and (b) the crafted programs of `tests/crafted.py` (the three
code routes and the resource bombs), recording the status, the time of each upload and the
service's resident memory. For comparison it also times, in this process, the check the service
ran in-process before (safe load and fingerprint, no bounds, no child).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from torch import nn

from bench.hostile_requests import rss_mb, service_pid
from service.launch import serve_process
from tests import crafted
from tuner.graph.capture import export_module, save_program
from tuner.graph.fingerprint import model_fingerprint
from tuner.loading.load import load_program

REPO = Path(__file__).resolve().parents[1]


def big_program(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU())
    net = nn.Sequential(*net, nn.Linear(2048, 2048), nn.ReLU())
    return save_program(export_module(net.eval(), (torch.randn(8, 2048),)), path)


def upload(url: str, path: Path) -> tuple[int, float, str]:
    start = time.monotonic()
    with path.open("rb") as f:
        resp = httpx.post(f"{url}/api/v1/models", files={"file": (path.name, f)}, timeout=600)
    detail = "" if resp.is_success else str(resp.json().get("detail", ""))[:160]
    return resp.status_code, time.monotonic() - start, detail


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upload_checks")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "upload_checks.json")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="fxtune-upload-checks-"))
    programs = [big_program(root / f"big{i}.pt2", i) for i in range(args.repeats)]
    size_mb = programs[0].stat().st_size / 2**20
    in_process = []
    for path in programs:
        start = time.monotonic()
        model_fingerprint(load_program(path))
        in_process.append(time.monotonic() - start)
    good = crafted.good_program(root / "good.pt2")
    dynamic = crafted.dynamic_program(root / "dynamic.pt2")
    marker = root / crafted.CODE_MARKER
    hostile = {
        "expression_exec": crafted.expression_exec(dynamic, root / "expr.pt2", marker),
        "guard_exec": crafted.guard_exec(dynamic, root / "guard.pt2", marker),
        "name_exec": crafted.name_exec(good, root / "name.pt2", marker),
        "zeros_bomb": crafted.zeros_bomb(root / "zeros.pt2"),
        "matmul_chain": crafted.matmul_chain(root / "chain.pt2"),
        "strided_weight": crafted.strided_weight(good, root / "strided.pt2"),
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("FXTUNE_")}
    env.update(FXTUNE_DATA_DIR=str(root / "data"), PYTHONPATH=str(REPO))
    results: dict[str, object] = {"program_mb": round(size_mb, 1)}
    with serve_process(env, root / "serve.log") as url:
        pid = service_pid(int(url.rsplit(":", 1)[1]))
        timings = [upload(url, path) for path in programs]
        assert all(code == 201 for code, _, _ in timings), timings
        rows = {}
        for name, path in hostile.items():
            code, seconds, detail = upload(url, path)
            rows[name] = {"status": code, "s": round(seconds, 2), "detail": detail}
        results["hostile"] = rows
        results["service_rss_mb"] = rss_mb(pid)
    results["upload_s_median"] = round(statistics.median(t for _, t, _ in timings), 2)
    results["upload_s"] = [round(t, 2) for _, t, _ in timings]
    results["in_process_check_s_median"] = round(statistics.median(in_process), 2)
    results["marker_written"] = marker.exists()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
