"""`python -m bench.gpu_check --out DIR`: run every row of the check, write its JSON and Markdown.

Rows, in this order (the headline first, so the deadline cuts the least telling ones):
`pytest -m cuda`, the recsys example at batch 256, the service with a worker on the device and
`load_tuned` on it, then cnn, transformer, bert_mini, vit_tiny, the dynamic MLP and a training
step. Each model and the service run in a process of their own (`bench.gpu_check.isolate`): a
segfault is a "crashed: signal 11" row and the rest still run. A deadline (450 s on a GPU)
bounds the whole run: a row that would start too late is "skipped", and each row's timeout is
what is left of it.

Without `--device`, the device is CUDA where torch sees one; where it does not, the check writes
"no CUDA device: nothing checked" and exits 0. `--device cpu` is a dry run of the whole harness
on the CPU with tiny budgets (subprocesses, crash isolation, peers timing, tables).
Exit status: 0 when every row is ok (or nothing could be checked), 1 otherwise, 4 when
`--device cuda` was asked for and there is none.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.gpu_check import tables
from bench.gpu_check.isolate import run_isolated
from bench.gpu_check.models import REGISTRY, path_of, resolve

CHECKS = ("cuda-tests", "models", "service")
MIN_ROW_S = 20.0  # a row started with less than this left would only time out
LOGS = "logs"  # in OUT: each row's logs, job, row and tuning report
LOGS_ARCHIVE = "gpu-check-logs.tar.gz"  # the same, as one file (`--archive-logs`)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="folder for gpu-check.json/.md")
    p.add_argument("--device", default=None, help="cuda, cuda:N, or cpu for a dry run")
    p.add_argument("--models", nargs="*", default=list(REGISTRY), help="registry models to run")
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=MODULE:ATTR",
        help="an extra model from its ModelSpec's import path (tests use it)",
    )
    p.add_argument("--checks", nargs="*", default=list(CHECKS), choices=CHECKS)
    p.add_argument("--peers", nargs="*", default=None, help="only these peers (default: all)")
    p.add_argument("--tune-budget-s", type=float, default=None, help="every model's budget")
    p.add_argument("--compare-s", type=float, default=None, help="per timed comparison")
    p.add_argument("--service-budget-s", type=float, default=None)
    p.add_argument("--service-model", default="bert_mini", choices=list(REGISTRY))
    p.add_argument("--deadline-s", type=float, default=None, help="the whole run's limit")
    p.add_argument("--keep-work", action="store_true", help="keep the work folder (models, traces)")
    p.add_argument(
        "--archive-logs",
        action="store_true",
        help=f"the rows' logs as one OUT/{LOGS_ARCHIVE}, not a folder (for a machine that "
        "sends back only a few files)",
    )
    p.add_argument(
        "--row-slack-s",
        type=float,
        default=None,
        help="per model, beyond its tuning budget: build, load, peers, timing",
    )
    return p


def _probe(requested: str | None) -> tuple[Any, str]:
    """The device to check (a tuner Device) or None, and a description of the machine."""
    try:
        import torch
    except ImportError as exc:  # no torch at all: nothing to check either
        return None, f"torch is not importable here ({exc})"
    from tuner.contract.device import Device

    if requested is not None:
        return Device.parse(requested), f"torch {torch.__version__}"
    if torch.cuda.is_available():
        return Device.parse("cuda"), f"torch {torch.__version__}"
    return None, f"torch {torch.__version__} sees no CUDA device"


def _allow_unchecked_torch() -> str | None:
    """On a torch outside fxtune's checked series (a GPU image's own), the check runs anyway,
    with the override set for every row and child, and says so: finding what breaks on that
    torch is what the check is for."""
    import torch

    from tuner.host.torch_compat import ALLOW_ENV, CHECKED_SERIES, series

    if series(torch.__version__) in CHECKED_SERIES:
        return None
    os.environ[ALLOW_ENV] = "1"
    return (
        f"torch {torch.__version__} is not a series fxtune was checked on "
        f"({', '.join(CHECKED_SERIES)}): run with {ALLOW_ENV}=1"
    )


def _machine(device: Any) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__}
    unchecked = _allow_unchecked_torch()
    if unchecked:
        info["unchecked_torch"] = unchecked
    if device.kind == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device.torch_device)
        info["cuda"] = torch.version.cuda
    return info


def _extra_models(entries: list[str]) -> dict[str, str]:
    out = {}
    for entry in entries:
        name, sep, path = entry.partition("=")
        if not sep or ":" not in path:
            raise SystemExit(f"--model wants NAME=MODULE:ATTR, got {entry!r}")
        out[name] = path
    return out


def plan(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """(kind, name, spec path) per row, in running order."""
    models = [("model", n, path_of(n)) for n in args.models if n in REGISTRY]
    unknown = [n for n in args.models if n not in REGISTRY]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(REGISTRY)}")
    models += [("model", n, p) for n, p in _extra_models(args.model).items()]
    if "models" not in args.checks:
        models = []
    rows: list[tuple[str, str, str | None]] = []
    if "cuda-tests" in args.checks:
        rows.append(("cuda-tests", "pytest -m cuda", None))
    rows += models[:1]
    if "service" in args.checks:
        rows.append(("service", "service + load_tuned", None))
    return rows + models[1:]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    started, clock = datetime.now(UTC).isoformat(timespec="seconds"), time.monotonic()
    device, machine = _probe(args.device)
    if device is None:
        doc = {"status": f"no CUDA device: nothing checked ({machine})", "started": started}
        json_path, md_path = tables.write(args.out, doc)
        print(f"{doc['status']}; wrote {json_path} and {md_path}")
        return 0
    try:
        device.require_available()
    except Exception as exc:
        doc = {"status": f"no CUDA device: nothing checked ({exc})", "started": started}
        tables.write(args.out, doc)
        print(doc["status"], file=sys.stderr)
        return 4
    cuda = device.kind == "cuda"
    base_job = {
        "deadline_s": args.deadline_s or (450.0 if cuda else 1800.0),
        "device": str(device),
        "compare_s": args.compare_s or 1.0,
        "tune_budget_s": args.tune_budget_s if args.tune_budget_s else (None if cuda else 3.0),
        "service_budget_s": args.service_budget_s or (10.0 if cuda else 3.0),
        "peers": args.peers,
        "service_model": args.service_model,
    }
    # Models, packages and traces stay out of OUT (it comes back from a GPU machine): only the
    # logs and reports are copied there at the end.
    work = Path(tempfile.mkdtemp(prefix="fxtune-gpu-check-"))
    base_job["work"] = str(work)
    try:
        return _run_rows(args, device, base_job, work, started, clock)
    finally:
        _keep_logs(work, args.out, archive=args.archive_logs)
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)


def _run_rows(
    args: argparse.Namespace,
    device: Any,
    base_job: dict[str, Any],
    work: Path,
    started: str,
    clock: float,
) -> int:
    from bench.gpu_check.cuda_tests import check_cuda_tests
    from bench.run import PEERS

    cuda = device.kind == "cuda"
    deadline_s = base_job["deadline_s"]
    slack_s = args.row_slack_s or (240.0 if cuda else 600.0)
    peers = [p for p in PEERS[device.kind] if args.peers is None or p in args.peers]
    doc: dict[str, Any] = {"started": started, **_machine(device), "peers": peers,
                           "deadline_s": deadline_s, "models": [], "checks": []}  # fmt: skip

    for kind, name, spec in plan(args):
        left = deadline_s - (time.monotonic() - clock)
        target = doc["models"] if kind == "model" else doc["checks"]
        if left < MIN_ROW_S:
            skipped = f"skipped: {deadline_s:.0f} s deadline"
            target.append({"name": name, "kind": kind, "status": skipped})
            continue
        print(f"[gpu-check] {name} ({left:.0f} s left)", flush=True)
        if kind == "cuda-tests":
            row = check_cuda_tests(work, cuda, timeout_s=min(180.0, left))
        elif kind == "service":
            job = {**base_job, "kind": "service", "name": "service"}
            row = run_isolated(job, work, min(base_job["service_budget_s"] + 200.0, left))
            row["name"] = name
        else:
            budget = base_job["tune_budget_s"] or resolve(spec).budget_s
            timeout = min(budget + 15 + slack_s, left)
            job = {**base_job, "kind": "model", "name": name, "spec": spec,
                   "ends_at": time.time() + timeout}  # fmt: skip
            row = run_isolated(job, work, timeout)
        print(f"[gpu-check] {name}: {row['status']} ({row.get('wall_s', 0):.0f} s)", flush=True)
        target.append(row)
        tables.write(args.out, _finished(doc, clock, cuda))  # a partial table if the run is cut
    _relative_logs(doc, work)
    json_path, md_path = tables.write(args.out, _finished(doc, clock, cuda))
    print(md_path.read_text())
    print(f"wrote {json_path} and {md_path}")
    if cuda:  # a run on a GPU is the current one (a dry run or "no CUDA" never replaces it)
        CURRENT.write_text(json_path.read_text())
        print(f"and {CURRENT} (`make tables` renders it)")
    rows = doc["models"] + doc["checks"]
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


def _finished(doc: dict[str, Any], clock: float, cuda: bool) -> dict[str, Any]:
    rows = doc["models"] + doc["checks"]
    ok = sum(1 for r in rows if r.get("status") == "ok")
    what = "checked on CUDA" if cuda else "dry run on the CPU (no GPU figures)"
    doc["status"] = f"{what}: {ok} of {len(rows)} rows ok"
    doc["wall_s"] = round(time.monotonic() - clock, 1)
    return doc


KEPT = (".log", ".json", ".xml")
CURRENT = Path(__file__).resolve().parents[1] / "out" / tables.JSON_NAME  # bench/out/gpu-check.json
MAX_KEPT_BYTES = 8 << 20


def _kept(path: Path, work: Path) -> bool:
    """Logs, jobs, rows and tuning reports; not profiler traces (megabytes each) nor the
    service's own data folder."""
    if not path.is_file() or path.suffix not in KEPT or path.name.endswith(".trace.json"):
        return False
    if path.relative_to(work).parts[:2] == ("service", "data"):
        return False
    return path.stat().st_size <= MAX_KEPT_BYTES


def _keep_logs(work: Path, out: Path, archive: bool = False) -> None:
    """Copy each row's logs, job, row and tuning report from the work folder to OUT/logs, or
    with `archive` into OUT/gpu-check-logs.tar.gz under the same names (`logs/...`)."""
    kept = [path for path in sorted(work.rglob("*")) if _kept(path, work)]
    if archive:
        out.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out / LOGS_ARCHIVE, "w:gz") as tar:
            for path in kept:
                tar.add(path, arcname=str(Path(LOGS) / path.relative_to(work)))
        return
    for path in kept:
        target = out / LOGS / path.relative_to(work)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)


def _relative_logs(doc: dict[str, Any], work: Path) -> None:
    """Rows name their logs as they will be in OUT (`logs/...`), not in the work folder."""
    for row in doc["models"] + doc["checks"]:
        for holder in (row, row.get("tune") or {}):
            log = holder.get("log")
            if log and Path(log).is_relative_to(work):
                holder["log"] = str(Path(LOGS) / Path(log).relative_to(work))
