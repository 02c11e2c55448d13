"""What checking uploads in a sandboxed child costs, warm and cold, and what hostile programs get.

`python -m bench.upload_checks [--out bench/out/upload_checks.json]` starts a real `fxtune serve`
twice: with `FXTUNE_WARM_CHECKERS=0` (every check starts its own child: "cold") and with the
default (one child started ahead, sandboxed and warmed up: "warm"). Each uploads (a) fresh ~50 MB
programs (an MLP of 12.6M float32 parameters, new weights each time, so nothing is
deduplicated), `--pause-s` apart so that a warm checker is ready again for each (the time a
replacement needs here), and, warm, as many again back to back (each then waits for the
replacement of the previous one's checker to finish its start); (b) the crafted programs of
`tests/crafted.py` (the three code routes and the resource bombs), recording the status, the
time of each upload, the service's resident memory and the warm checker's. For comparison it also
times, in this process, the check the service ran in-process before (safe load and fingerprint,
no bounds, no child).
"""

from __future__ import annotations

import argparse
import contextlib
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


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = [int(c) for c in (task / "children").read_text().split()]
                found += kids
                todo += kids
    return found


def warm_checker_rss_mb(service: int) -> float:
    """The resident memory of the service's waiting checkers (their Python, not bwrap)."""
    total = 0.0
    for pid in descendants(service):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if argv[1:4] == [b"-m", b"tuner.checks.inspect", b"warm"]:  # not bwrap's
                total += rss_mb(pid)
    return round(total, 1)


def run_service(
    env: dict[str, str],
    log: Path,
    spaced: list[Path],
    back_to_back: list[Path],
    hostile: dict[str, Path],
    pause_s: float,
) -> dict[str, object]:
    """Upload `spaced` `pause_s` apart, then `back_to_back`, then the hostile ones spaced."""
    out: dict[str, object] = {}
    with serve_process(env, log) as url:
        pid = service_pid(int(url.rsplit(":", 1)[1]))
        timings = []
        for path in spaced:
            time.sleep(pause_s)
            timings.append(upload(url, path))
        assert all(code == 201 for code, _, _ in timings), timings
        out["upload_s"] = [round(t, 2) for _, t, _ in timings]
        out["upload_s_median"] = round(statistics.median(t for _, t, _ in timings), 2)
        if back_to_back:
            rapid = [upload(url, path) for path in back_to_back]
            assert all(code == 201 for code, _, _ in rapid), rapid
            out["back_to_back_s"] = [round(t, 2) for _, t, _ in rapid]
            out["back_to_back_s_median"] = round(statistics.median(t for _, t, _ in rapid), 2)
        rows = {}
        for name, path in hostile.items():
            time.sleep(pause_s)
            code, seconds, detail = upload(url, path)
            rows[name] = {"status": code, "s": round(seconds, 2), "detail": detail}
        out["hostile"] = rows
        time.sleep(pause_s)
        out["service_rss_mb"] = round(rss_mb(pid), 1)
        out["warm_checker_rss_mb"] = warm_checker_rss_mb(pid)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.upload_checks")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "upload_checks.json")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--pause-s", type=float, default=15.0, help="between spaced uploads (a checker's start)"
    )
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="fxtune-upload-checks-"))
    programs = [big_program(root / f"big{i}.pt2", i) for i in range(2 * args.repeats)]
    size_mb = programs[0].stat().st_size / 2**20
    in_process = []
    for path in programs[: args.repeats]:
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
    env.update(PYTHONPATH=str(REPO))
    spaced, rapid = programs[: args.repeats], programs[args.repeats :]
    results: dict[str, object] = {"program_mb": round(size_mb, 1), "pause_s": args.pause_s}
    cold_env = {**env, "FXTUNE_DATA_DIR": str(root / "cold"), "FXTUNE_WARM_CHECKERS": "0"}
    results["cold"] = run_service(cold_env, root / "cold.log", spaced, [], hostile, 0)
    warm_env = {**env, "FXTUNE_DATA_DIR": str(root / "warm")}
    results["warm"] = run_service(warm_env, root / "warm.log", spaced, rapid, hostile, args.pause_s)
    results["in_process_check_s_median"] = round(statistics.median(in_process), 2)
    results["marker_written"] = marker.exists()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
