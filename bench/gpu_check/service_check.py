"""The service end to end with a worker on the device, then `load_tuned` on that device.

`fxtune serve --embedded-worker --worker-device D` on loopback (SQLite in a throw-away folder),
`fxtune submit MODEL --device KIND --wait` of one registry model (bert_mini by default: a
transformers program with devices baked in at export, which `load_tuned` must move with the
weights), then `load_tuned(MODEL, server=..., device=D)`: it must apply the
config without falling back (no FxtuneClientWarning) and answer as the original does on fresh
inputs. Runs in its own process (`bench.gpu_check.isolate`).
"""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from bench.gpu_check.isolate import REPO, Row, child_env, signal_status
from bench.gpu_check.models import REGISTRY
from tuner.contract.device import Device

SUBMIT_SLACK_S = 120.0  # beyond the tuning budget: upload, claim, the worker's child, writing


def check_service(job: dict[str, Any], row: Row) -> None:
    from service.launch import serve_process
    from tuner.deploy.client import FxtuneClientWarning, load_tuned
    from tuner.host.sandbox import bwrap_works
    from tuner.measure.equivalence import ReferenceOutputs

    model = job["service_model"]
    device = Device.parse(job["device"])
    work = Path(job["work"]) / "service"
    work.mkdir(parents=True, exist_ok=True)
    row.stage("building", model=model, device=str(device))
    built = REGISTRY[model].build(work)
    env = {
        k: v for k, v in child_env().items() if k not in ("FXTUNE_DATABASE_URL", "FXTUNE_API_TOKEN")
    }
    env["FXTUNE_DATA_DIR"] = str(work / "data")
    if not bwrap_works():  # GPU images lack bubblewrap; the check's own models are trusted
        env["FXTUNE_WORKER_SANDBOX"] = "none"
    row.stage("starting the service", worker_sandbox=env.get("FXTUNE_WORKER_SANDBOX", "auto"))
    args = ("--embedded-worker", "--worker-device", str(device))
    with serve_process(env, work / "serve.log", *args, start_timeout_s=180) as url:
        row.stage("tuning through the service", server=url)
        cmd = [
            sys.executable, "-m", "fxtune_cli", "submit", str(built.path), "--server", url,
            "--device", device.kind, "--budget-s", str(job["service_budget_s"]), "--wait",
        ]  # fmt: skip
        started = time.monotonic()
        # A job handed back (a worker without the device exits 4) would be waited on forever.
        wait_s = job["service_budget_s"] + SUBMIT_SLACK_S
        try:
            with (work / "submit.log").open("w") as out:
                done = subprocess.run(
                    cmd, cwd=REPO, env=env, stdout=out, stderr=out, timeout=wait_s
                )
            code: int | None = done.returncode
        except subprocess.TimeoutExpired:
            code = None
        submit = {"rc": code, "wall_s": round(time.monotonic() - started, 1)}
        row.stage("load_tuned", submit=submit)
        if code != 0:
            why = (
                f"no result in {wait_s:.0f} s"
                if code is None
                else signal_status(code)
                if code < 0
                else f"exit {code}"
            )
            tail = (work / "submit.log").read_text(errors="replace").strip().splitlines()[-2:]
            row.data["status"] = f"fxtune submit --wait: {why}: {' / '.join(tail)[:300]}"
            row.stage("done")
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", FxtuneClientWarning)
            tuned = load_tuned(
                built.path, server=url, device=device, cache_dir=work / "client-cache"
            )
        fallbacks = [str(w.message) for w in caught if issubclass(w.category, FxtuneClientWarning)]
    from tuner.graph.capture import on_device
    from tuner.loading.load import load_program
    from tuner.tuning.tuner import to_device

    original = on_device(load_program(built.path), device.torch_device).module()
    trials = [tuple(to_device(x, device) for x in t) for t in built.trials]
    mismatch, (abs_err, _) = ReferenceOutputs(original, trials).check_with_errors(tuned)
    row.data["status"] = (
        f"load_tuned warned: {'; '.join(fallbacks)[:300]}"
        if fallbacks
        else ("ok" if mismatch is None else f"load_tuned: wrong outputs: {mismatch}")
    )
    row.stage(
        "done",
        load_tuned={"module": type(tuned).__name__, "max_abs_error": abs_err},
        outputs="equal" if mismatch is None else f"differ: {mismatch}",
    )
