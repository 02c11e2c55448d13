"""`fxtune worker`: mounted by the composition root next to the tuner's and service's commands."""

from __future__ import annotations

import logging
import signal
from typing import Annotated

import typer

from tuner.contract.device import Device
from tuner.contract.exit_codes import ExitCode

app = typer.Typer(no_args_is_help=True, add_completion=False)


def _leave(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@app.command("worker")
def worker_cmd(
    device: Annotated[
        Device,
        typer.Option(
            parser=Device.parse,
            metavar="DEVICE",
            help="Device this worker tunes on: cpu, cuda or xla, with an index if wanted (cuda:1)",
        ),
    ],
    server: Annotated[
        str | None, typer.Option(help="Service URL (env FXTUNE_SERVER)", show_default=False)
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="Worker token (env FXTUNE_WORKER_TOKEN)", show_default=False),
    ] = None,
    once: Annotated[bool, typer.Option(help="Do at most one job, then exit")] = False,
    ranks: Annotated[
        int | None,
        typer.Option(
            min=1, help="Ranks of distributed jobs it can run (env FXTUNE_WORKER_RANKS, default 1)"
        ),
    ] = None,
) -> None:
    """Claim tuning jobs for DEVICE from the service and run each in a limited child process."""
    from tuner.contract.errors import DeviceUnavailableError, UncheckedTorchError
    from tuner.host.child_env import undumpable
    from tuner.host.sandbox import SandboxUnavailable, resolve_sandbox
    from worker.client import ServiceError
    from worker.config import WorkerSettings
    from worker.hardware import detect
    from worker.loop import Worker, install_signal_handlers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(message)s")
    # httpx logs every request at INFO: here those are the claim polls and heartbeats, which
    # repeat every few seconds (worker.loop logs what a job does).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # until the loop's own handlers: unwind (and
        signal.signal(sig, _leave)  # subprocess.run kills the device probe on the way out)
    undumpable()  # its token stays out of a same-user child's reach (`child_env.undumpable`)
    given = {"server": server, "worker_token": token, "worker_ranks": ranks}
    overrides = {k: v for k, v in given.items() if v}
    settings = WorkerSettings(**overrides)
    try:
        resolve_sandbox(settings.worker_sandbox)  # before anything else: a refusal is quick
    except SandboxUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.USER_INPUT) from None
    try:
        hardware = detect(device)  # and torch checked: every job would fail on an unchecked one
    except UncheckedTorchError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.INTERNAL) from None
    except DeviceUnavailableError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(ExitCode.DEVICE) from None
    worker = Worker(settings, device, hardware)
    install_signal_handlers(worker.stop)
    logging.getLogger("fxtune.worker").info(
        "%s serving %s (%s, %d rank(s), sandbox %s) for %s",
        worker.id,
        device,
        hardware.get("name"),
        settings.worker_ranks,
        worker.sandbox_kind,
        settings.server,
    )
    try:
        worker.run(once=once)
    except ServiceError as exc:  # e.g. 401/403: a wrong token or server will not fix itself
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        worker.close()
        worker.client.close()
    if worker.device_lost is not None:
        typer.echo(f"error: stopped claiming jobs: {worker.device_lost}", err=True)
        raise typer.Exit(ExitCode.DEVICE)
