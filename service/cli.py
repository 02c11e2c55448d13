"""`fxtune serve` and `fxtune submit`; heavy imports stay inside the commands."""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlencode

import typer

from tuner.host.child_env import is_secret_name

if TYPE_CHECKING:
    from service.core.config import Settings

app = typer.Typer(no_args_is_help=True, add_completion=False)

DEFAULT_SERVER = "http://127.0.0.1:8000"
ServerOpt = Annotated[
    str | None, typer.Option(help=f"Service URL (env FXTUNE_SERVER, else {DEFAULT_SERVER})")
]
TokenOpt = Annotated[
    str | None, typer.Option(help="Bearer token (env FXTUNE_API_TOKEN)", show_default=False)
]


# What `fxtune serve` imports beyond the base install (module: the distribution that has it).
SERVICE_EXTRA = {
    "fastapi": "fastapi",
    "uvicorn": "uvicorn",
    "sqlalchemy": "sqlalchemy",
    "alembic": "alembic",
    "jinja2": "jinja2",
    "python_multipart": "python-multipart",
}


def missing_for_serve(database_url: str) -> tuple[str, list[str]]:
    """(the extra to install, the distributions it would bring that are missing here).

    The base install (`pip install fxtune`) has no web server and no database; asking it to
    serve must say what to install, not end in an ImportError traceback.
    """
    missing = [dist for mod, dist in SERVICE_EXTRA.items() if importlib.util.find_spec(mod) is None]
    if missing:
        return "service", missing
    if database_url.startswith("postgresql") and importlib.util.find_spec("psycopg") is None:
        return "postgres", ["psycopg"]
    return "", []


def _local_url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _die_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def spawn_worker(server: str, device: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The embedded worker is a child that talks HTTP like any other worker."""
    cmd = [sys.executable, "-m", "fxtune_cli", "worker", "--server", server, "--device", device]
    return subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)


class WorkerWatch:
    """Stops the service when its embedded worker ends: a worker that refused to start (no
    sandbox, no such device, another torch) would otherwise leave every job queued for ever
    behind a service that looks healthy. The service then exits with the worker's code."""

    def __init__(self, worker: subprocess.Popen[bytes]) -> None:
        self.worker = worker
        self.stopping = threading.Event()
        self.code: int | None = None
        threading.Thread(target=self._watch, name="embedded-worker-watch", daemon=True).start()

    def _watch(self) -> None:
        code = self.worker.wait()
        if self.stopping.is_set():
            return
        self.code = code if code > 0 else 1
        typer.echo(
            f"error: the embedded worker exited with code {code}; the service stops, since "
            "no job it takes could run (the worker's message is above)",
            err=True,
        )
        os.kill(os.getpid(), signal.SIGTERM)

    def stop(self) -> None:
        self.stopping.set()
        stop_child(self.worker)


def embedded_worker_identity(settings: Settings) -> tuple[Settings, dict[str, str]]:
    """Settings with a worker token, and the embedded worker's environment.

    A service with a user token but no FXTUNE_WORKER_TOKEN makes one up for its own worker, so
    the worker routes never take the user's token. The worker is given no secret but its own
    token: not the user token, not the database's URL.
    """
    from pydantic import SecretStr

    if settings.worker_secret is None and settings.token is not None:
        settings = settings.model_copy(
            update={"worker_token": SecretStr(secrets.token_urlsafe(32))}
        )
    env = {k: v for k, v in os.environ.items() if not is_secret_name(k)}  # the user token, the
    if settings.worker_secret is not None:  # database's URL: the worker needs neither
        env["FXTUNE_WORKER_TOKEN"] = settings.worker_secret
    return settings, env


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP end this process through SystemExit, so `finally` blocks run and
    stop its children. (uvicorn handles SIGTERM while it serves, and re-raises it when it has
    shut down: with Python's default action the process would die right there and leave its
    embedded worker behind.)"""

    def leave(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, leave)


def stop_child(proc: subprocess.Popen[bytes], grace_s: float = 15) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@app.command("serve")
def serve_cmd(
    host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8000,
    embedded_worker: Annotated[
        bool, typer.Option(help="Also run one worker as a child process")
    ] = False,
    worker_device: Annotated[str, typer.Option(help="Device of the embedded worker")] = "cpu",
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
) -> None:
    """Run the HTTP API (uvicorn); settings come from FXTUNE_* variables."""
    from service.core.config import get_settings
    from tuner.host.child_env import undumpable

    undumpable()  # its tokens and database URL stay out of a same-user child's reach

    settings = get_settings()
    extra, missing = missing_for_serve(settings.resolved_database_url)
    if missing:
        typer.echo(
            f"error: `fxtune serve` needs fxtune's {extra} extra (missing: {', '.join(missing)}); "
            f"install it with: pip install 'fxtune[{extra}]'",
            err=True,
        )
        raise typer.Exit(1)
    import uvicorn

    from tuner.contract.errors import UncheckedTorchError
    from tuner.host.torch_compat import check_torch

    try:
        check_torch()  # uploads are checked with torch's export schema (loading.program_schema)
    except UncheckedTorchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    from service.access_log import log_config
    from service.db.engine import make_engine
    from service.db.migrate import SchemaMismatch, upgrade_to_head
    from service.main import create_app

    exit_on_signals()
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.resolved_database_url)
    try:
        upgrade_to_head(engine)  # fail here, clearly, rather than inside uvicorn's start-up
    except SchemaMismatch as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    finally:
        engine.dispose()
    worker = None
    if embedded_worker:
        settings, worker_env = embedded_worker_identity(settings)
        worker = WorkerWatch(spawn_worker(_local_url(host, port), worker_device, worker_env))
    try:
        uvicorn.run(
            create_app(settings),
            host=host,
            port=port,
            log_level=log_level,
            log_config=log_config(),
        )
    except SystemExit as exc:  # a signal (exit_on_signals), after uvicorn's graceful shutdown
        code = exc.code if isinstance(exc.code, int) else 1
        if worker is not None:
            worker.stop()
            code = worker.code or code
        # Everything is closed: leave as the signal's default action would, without the
        # interpreter's teardown of torch and friends (a second or more).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    finally:
        if worker is not None:
            worker.stop()


def _client(server: str | None, token: str | None) -> Any:
    import httpx

    token = token or os.environ.get("FXTUNE_API_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    base = server or os.environ.get("FXTUNE_SERVER") or DEFAULT_SERVER
    return httpx.Client(base_url=base.rstrip("/"), headers=headers, timeout=600)


def _check(resp: Any) -> dict[str, Any]:
    if resp.is_error:
        detail: Any = resp.text
        with contextlib.suppress(ValueError):
            detail = resp.json().get("detail", detail)
        typer.echo(f"error: {resp.status_code} {detail}", err=True)
        raise typer.Exit(1)
    return resp.json()


@app.command("submit")
def submit_cmd(
    model: Annotated[Path, typer.Argument(help="A torch.export program saved as .pt2")],
    server: ServerOpt = None,
    device: Annotated[str, typer.Option(help="Device to tune for: cpu, cuda or xla")] = "cpu",
    budget_s: Annotated[
        float | None, typer.Option(help="Tuning budget in seconds", show_default=False)
    ] = None,
    name: Annotated[str | None, typer.Option(help="Display name", show_default=False)] = None,
    wait: Annotated[bool, typer.Option(help="Follow the job until it ends")] = False,
    token: TokenOpt = None,
    world_size: Annotated[
        int,
        typer.Option(
            "--world-size",
            min=1,
            help="Ranks of a distributed job (>1: MODEL holds {rank}, one program per rank)",
        ),
    ] = 1,
    mode: Annotated[
        str,
        typer.Option(help="infer, or train: tune a training step (export the model in train mode)"),
    ] = "infer",
    optimizer: Annotated[
        str | None,
        typer.Option(help="With --mode train: one optimizer step per step (sgd, adamw)"),
    ] = None,
) -> None:
    """Upload MODEL and queue it for tuning; with --wait, follow the job with a progress bar."""
    import httpx

    if world_size > 1:
        if mode != "infer":
            typer.echo("error: --mode train is not supported with --world-size (yet)", err=True)
            raise typer.Exit(2)
        try:
            with _client(server, token) as http:
                job = submit_distributed(http, str(model), world_size, device, budget_s, name)
                if wait:
                    _follow_to_the_end(http, job["id"])
        except httpx.TransportError as exc:
            typer.echo(f"error: cannot reach the service: {exc}", err=True)
            raise typer.Exit(1) from None
        return
    if not model.is_file():
        typer.echo(f"error: no such file: {model}", err=True)
        raise typer.Exit(2)
    fields = {"tune": "true", "device": device, "mode": mode}
    if optimizer is not None:
        fields["optimizer"] = optimizer
    if budget_s is not None:
        fields["budget_s"] = str(budget_s)
    if name:
        fields["name"] = name
    try:
        with _client(server, token) as http, model.open("rb") as f:
            body = _check(http.post("/api/v1/models", data=fields, files={"file": (model.name, f)}))
            job = body["job"]
            sha = body["sha256"][:12]
            typer.echo(f"model {body['id']} ({sha}), job {job['id']}: {job['status']}")
            if wait:
                _follow_to_the_end(http, job["id"])
    except httpx.TransportError as exc:
        typer.echo(f"error: cannot reach the service: {exc}", err=True)
        raise typer.Exit(1) from None


def _follow_to_the_end(http: Any, job_id: int) -> None:
    """Follow the job with a progress bar, print its outcome, and exit 1 unless it succeeded."""
    final = follow_job(http, job_id)
    _print_outcome(http, final)
    if final["status"] != "succeeded":
        raise typer.Exit(1)


def submit_distributed(
    http: Any,
    pattern: str,
    world_size: int,
    device: str,
    budget_s: float | None,
    name: str | None,
) -> dict[str, Any]:
    """Upload every rank's program (`{rank}` in `pattern`), then queue one job naming them."""
    if "{rank}" not in pattern:
        typer.echo("error: with --world-size, MODEL must hold {rank}", err=True)
        raise typer.Exit(2)
    paths = [Path(pattern.replace("{rank}", str(rank))) for rank in range(world_size)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        typer.echo(f"error: no such file: {', '.join(missing)}", err=True)
        raise typer.Exit(2)
    ids = []
    for rank, path in enumerate(paths):
        fields = {"name": f"{name} rank {rank}"} if name else {}
        with path.open("rb") as f:
            body = _check(http.post("/api/v1/models", data=fields, files={"file": (path.name, f)}))
        ids.append(body["id"])
    request: dict[str, Any] = {"device": device, "world_size": world_size, "rank_models": ids}
    if budget_s is not None:
        request["budget_s"] = budget_s
    job = _check(http.post(f"/api/v1/models/{ids[0]}/jobs", json=request))
    typer.echo(f"models {', '.join(map(str, ids))} (ranks 0..{world_size - 1}), "
               f"job {job['id']}: {job['status']}")  # fmt: skip
    return job


def follow_job(http: Any, job_id: int, poll_s: float = 0.5) -> dict[str, Any]:
    """Poll one job with a rich progress bar until it succeeds or fails."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (
        TextColumn("job {task.fields[job]}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}: {task.description}"),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("queued", total=1.0, job=job_id, status="queued")
        while True:
            job = _check(http.get(f"/api/v1/jobs/{job_id}"))
            message = (job.get("message") or "")[:60]
            bar.update(task, completed=job["progress"], description=message, status=job["status"])
            if job["status"] in ("succeeded", "failed"):
                return job
            time.sleep(poll_s)


def _print_outcome(http: Any, job: dict[str, Any]) -> None:
    if job["status"] != "succeeded":
        typer.echo(f"job {job['id']} failed: {job.get('error')}", err=True)
        return
    target = {"device": job["device"], "mode": job.get("mode", "infer")}
    report = _check(http.get(f"/api/v1/models/{job['model_id']}/report", params=target))
    whole = report["config"].get("whole_model", {})
    speedup = whole.get("speedup")
    shown = f"{speedup:.2f}x" if isinstance(speedup, int | float) else "n/a"
    typer.echo(
        f"tuned: backend {report['config'].get('backend')}, speedup {shown} "
        f"({whole.get('verdict')}); config at /api/v1/models/{job['model_id']}/config"
        f"?{urlencode(target)}"
    )
