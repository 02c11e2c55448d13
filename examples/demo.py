"""`make demo`: the product on one machine, over HTTP, from a fresh clone.

Builds the example models, starts `fxtune serve --embedded-worker` on a free loopback port with a
throw-away data dir (SQLite), uploads every example with tune=true, follows the jobs, prints the
speedup table and the dashboard URL, stops the service and exits 0 when every job succeeded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from service.launch import serve_process
from tuner.measure.summary import format_interval

console = Console()


@contextlib.contextmanager
def service(data_dir: Path, log: Path) -> Iterator[str]:
    """`fxtune serve --embedded-worker` on loopback with a throw-away data dir (SQLite)."""
    env = {k: v for k, v in os.environ.items() if k != "FXTUNE_DATABASE_URL"}
    env["FXTUNE_DATA_DIR"] = str(data_dir)
    with serve_process(env, log, "--embedded-worker", start_timeout_s=180) as url:
        yield url


def upload_all(http: httpx.Client, models: dict[str, Path], budget_s: float) -> dict[str, Any]:
    jobs = {}
    for name, path in models.items():
        with path.open("rb") as f:
            resp = http.post(
                "/api/v1/models",
                files={"file": (path.name, f)},
                data={"name": name, "tune": "true", "device": "cpu", "budget_s": str(budget_s)},
            )
        resp.raise_for_status()
        jobs[name] = resp.json()["job"]
    return jobs


def follow(http: httpx.Client, jobs: dict[str, Any]) -> dict[str, Any]:
    """One progress bar per job until every job has succeeded or failed."""
    columns = (
        TextColumn("{task.fields[model]:<12}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    final: dict[str, Any] = {}
    with Progress(*columns, console=console) as bars:
        tasks = {name: bars.add_task("queued", total=1.0, model=name) for name in jobs}
        while len(final) < len(jobs):
            for name, job in jobs.items():
                if name in final:
                    continue
                now = http.get(f"/api/v1/jobs/{job['id']}").json()
                text = f"{now['status']}: {(now.get('message') or '')[:50]}"
                bars.update(tasks[name], completed=now["progress"], description=text)
                if now["status"] in ("succeeded", "failed"):
                    final[name] = now
            time.sleep(0.5)
    return final


# An interval wider than this (high / low) says the machine's noise, not the model, decided.
NOISY_WIDTH = 1.15


def too_noisy(config: dict[str, Any]) -> str | None:
    """Why nothing shipped was the machine's noise: the fastest candidate's interval was too wide
    to call (None when something shipped or the intervals were tight)."""
    if config["whole_model"]["verdict"] == "faster":
        return None
    timed = [c for c in config["candidates"] if c.get("ci") and c.get("speedup")]
    if not timed:
        return None
    best = max(timed, key=lambda c: c["speedup"])
    low, high = best["ci"]
    if low <= 0 or high / low < NOISY_WIDTH:
        return None
    return (
        f"{best['name']} measured {best['speedup']:.2f}x but its interval "
        f"{format_interval(best['ci'])} is too wide to decide: the machine was too noisy. "
        "Run the demo again on a quieter machine, or with a larger --budget-s"
    )


def speedup_table(http: httpx.Client, final: dict[str, Any], notes: list[str]) -> Table:
    table = Table("model", "status", "backend", "speedup", "95% interval", "sites accepted")
    for name, job in final.items():
        if job["status"] != "succeeded":
            table.add_row(name, "[red]failed[/red]", "", "", "", "")
            continue
        report = http.get(f"/api/v1/models/{job['model_id']}/report", params={"device": "cpu"})
        config = report.json()["config"]
        whole = config["whole_model"]
        if (noisy := too_noisy(config)) is not None:
            notes.append(f"{name}: {noisy}")
        shipped = whole["verdict"] == "faster"
        speedup = f"{whole['speedup']:.2f}x" if whole.get("speedup") else "-"
        if not shipped:
            speedup += f" ({whole['verdict']}: original kept)"
        interval = format_interval(whole.get("ci"))
        sites = config["sites"]
        accepted = f"{sum(1 for s in sites if s['accepted'])}/{len(sites)}"
        table.add_row(
            name, "[green]succeeded[/green]", config["backend"], speedup, interval, accepted
        )
    return table


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def main(argv: list[str] | None = None) -> int:
    from service.cli import exit_on_signals

    exit_on_signals()  # SIGTERM unwinds the `with` blocks below: the service is stopped, not left
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--budget-s",
        type=float,
        default=30,
        help="tuning budget per model (the tuning command's wall time, loading included)",
    )
    parser.add_argument("--keep-serving", action="store_true", help="leave the service up")
    args = parser.parse_args(argv)
    from examples.build import build_all

    with tempfile.TemporaryDirectory(prefix="fxtune-demo-") as tmp:
        root = Path(tmp)
        with console.status("building the example models"):
            models = build_all(root / "models")
        console.print(f"built {len(models)} example models: {', '.join(models)}")
        with service(root / "data", root / "serve.log") as url:
            console.print(f"service up at {url} (embedded worker, SQLite in {root / 'data'})")
            token = os.environ.get("FXTUNE_API_TOKEN")
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
                final = follow(http, upload_all(http, models, args.budget_s))
                notes: list[str] = []
                console.print(speedup_table(http, final, notes))
                for note in notes:
                    console.print(note, style="yellow", markup=False)
            for name, job in final.items():
                if job["status"] != "succeeded":
                    console.print(f"{name} failed: {job['error']}", style="red", markup=False)
            if any(j["status"] != "succeeded" for j in final.values()):
                console.print("service log (tail):\n" + tail(root / "serve.log"), markup=False)
            if args.keep_serving and httpx.get(f"{url}/healthz", timeout=5).is_success:
                console.print(f"dashboard: {url}/   API docs: {url}/docs   (serving until Ctrl-C)")
                with contextlib.suppress(KeyboardInterrupt):
                    signal.pause()
            else:
                console.print(
                    "the demo's service stops now; `make demo-serve` (or --keep-serving) keeps "
                    "it and its dashboard up"
                )
    return 0 if all(j["status"] == "succeeded" for j in final.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
