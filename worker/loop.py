"""The worker loop: claim, download, tune in a limited child, heartbeat, report."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tuner.contract.budget import kill_after_s, overran
from tuner.contract.device import Device
from tuner.contract.exit_codes import ExitCode
from tuner.host import job_caches
from tuner.host.child_env import MAX_ERROR_CHARS, MAX_PROGRESS_CHARS, Redactor
from tuner.host.sandbox import (
    ChildResult,
    Limits,
    Sandbox,
    physical_memory_bytes,
    resolve_sandbox,
    run_child,
    with_stacks,
)
from worker.client import Assignment, LeaseLost, ServiceClient, ServiceError
from worker.config import WorkerSettings
from worker.warm_temp import WarmTemp

log = logging.getLogger("fxtune.worker")

# `fxtune tune` exit codes (tuner.contract.exit_codes) after which another attempt cannot help: a
# bad or refused model fails the same anywhere. INTERNAL (1), signals and timeouts are retried;
# DEVICE (4) is retried elsewhere while this worker stops claiming (see run_job).
PERMANENT_EXITS = frozenset({ExitCode.USER_INPUT, ExitCode.REFUSED})
ONCE_PATIENCE_S = 60.0  # with --once, give up on a service that stays unreachable this long
RANK_INPUT = "input_rank{rank}.pt2"  # a distributed job's programs (`fxtune tune` fills {rank})
RANK_OUTPUT = "tuned_rank{rank}.pt2"
CACHE_IN = "cache"  # the job folder's read-only snapshot of the shared caches
CACHE_OUT = job_caches.RECORDED  # under the job's output folder: what it measured


class Heartbeat(threading.Thread):
    """Keeps the lease alive and relays the child's progress while the job runs."""

    def __init__(
        self, client: ServiceClient, job: Assignment, redact: Redactor = Redactor()
    ) -> None:
        super().__init__(daemon=True, name=f"heartbeat-{job.job_id}")
        self.client = client
        self.job = job
        self.redact = redact
        self.interval_s = max(0.5, min(job.lease_s / 3, 5.0))
        self.lost = False
        self._progress = (0.0, "started")
        self._sent_at = 0.0
        self._wake = threading.Event()
        self._done = threading.Event()

    def update(self, progress: float, message: str) -> None:
        self._progress = (progress, self.redact(message, MAX_PROGRESS_CHARS))
        if time.monotonic() - self._sent_at > 1.0:
            self._wake.set()

    def run(self) -> None:
        while not self._done.is_set() and not self.lost:
            self._send()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def _send(self) -> None:
        progress, message = self._progress
        try:
            self.client.heartbeat(self.job, progress, message)
            self._sent_at = time.monotonic()
        except LeaseLost as exc:
            log.warning("job %d: lease lost (%s); abandoning it", self.job.job_id, exc)
            self.lost = True
        except (httpx.HTTPError, ServiceError) as exc:
            log.warning("job %d: heartbeat failed (%s); retrying", self.job.job_id, exc)

    def stop(self) -> None:
        self._done.set()
        self._wake.set()
        self.join(timeout=30)


@dataclass(frozen=True)
class Outcome:
    status: str  # succeeded | failed | lost
    detail: str | None = None


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        device: Device | str,
        hardware: dict[str, Any],
        client: ServiceClient | None = None,
    ) -> None:
        """Raises SandboxUnavailable when bubblewrap cannot run and `none` was not chosen."""
        self.settings = settings
        self.device = Device.parse(device)
        self.sandbox_kind = resolve_sandbox(settings.worker_sandbox)
        # Declared with the hardware at every claim, so the dashboard shows unsandboxed workers.
        self.hardware = {**hardware, "sandbox": self.sandbox_kind}
        self.client = client or ServiceClient(settings.server, settings.token)
        # Whatever the child prints is relayed to the service: this worker's secrets are
        # masked in it, whether the child could have known them or not.
        self.redact = Redactor.of_environment(extra=(settings.token, settings.server))
        self.id = f"{socket.gethostname()}-{os.getpid()}-{self.device}"
        self._stop = threading.Event()
        self.device_lost: str | None = None  # why this worker stopped claiming, if it did
        self.warm = WarmTemp(settings.worker_warm_command, settings.worker_scratch_dir)

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        """Stop, and remove the warm folder (`worker.warm_temp`)."""
        self.stop()
        self.warm.close()

    def run(self, once: bool = False) -> int:
        """Work until stopped (or, with `once`, until one job is done or none is ready)."""
        done = 0
        self.warm.start(self.cpu_limits(), Sandbox(self.sandbox_kind))
        backoff = 1.0
        unreachable_since: float | None = None
        while not self._stop.is_set():
            try:
                # Jobs are per kind; the index stays this worker's ("cuda:1" tunes on cuda:1).
                job = self.client.claim(
                    self.id, self.device.kind, self.hardware, self.settings.worker_ranks
                )
            except httpx.TransportError as exc:
                unreachable_since = unreachable_since or time.monotonic()
                if once and time.monotonic() - unreachable_since > ONCE_PATIENCE_S:
                    raise ServiceError(f"cannot reach {self.settings.server}: {exc}") from None
                log.warning(
                    "cannot reach %s (%s); retrying in %.0fs", self.settings.server, exc, backoff
                )
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff, unreachable_since = 1.0, None
            if job is None:
                if once:
                    break
                log.debug("no job; asking again in %gs", self.settings.worker_poll_s)
                self._stop.wait(self.settings.worker_poll_s)
                continue
            outcome = self.run_job(job)
            log.info(
                "job %d %s%s",
                job.job_id,
                outcome.status,
                f": {outcome.detail}" if outcome.detail else "",
            )
            done += 1
            if once:
                break
        return done

    def run_job(self, job: Assignment) -> Outcome:
        log.info("job %d: model %d (%s) on %s", job.job_id, job.model_id, job.name, job.device)
        scratch = self.settings.worker_scratch_dir
        if scratch is not None:
            scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"fxtune-job{job.job_id}-", dir=scratch) as tmp:
            if job.device == "cpu":
                self.warm.seed(Path(tmp))
            return self._run_in(job, Path(tmp))

    def _run_in(self, job: Assignment, workdir: Path) -> Outcome:
        try:
            source = self.download(job, workdir)
        except (httpx.HTTPError, ServiceError) as exc:
            return self._fail(job, f"could not download the model: {exc}", retryable=True)
        out = workdir / "out"
        out.mkdir()
        beat = Heartbeat(self.client, job, self.redact)
        try:
            return self._tune_and_report(job, source, out, workdir, beat)
        finally:
            # The lease is kept alive until the result is accepted: the service checks a result
            # before storing it, which can outlast a short lease.
            if beat.is_alive():
                beat.stop()

    def _tune_and_report(
        self, job: Assignment, source: Path, out: Path, workdir: Path, beat: Heartbeat
    ) -> Outcome:
        sandbox = self.sandbox(job, workdir)
        began = time.monotonic()
        result = run_child(
            self.command(job, source, out, workdir),
            self.limits(job).within(sandbox),
            workdir,
            beat.update,
            cancelled=lambda: beat.lost or self._stop.is_set(),
            on_started=beat.start,
            env=self.child_env(),
            sandbox=sandbox,
            redact=self.redact,
        )
        run_s = time.monotonic() - began  # kept in the job record, succeeded or not
        if beat.lost:
            return Outcome("lost", "lease passed to another attempt")
        if not result.ok and result.returncode == ExitCode.DEVICE and not result.cancelled:
            # The device went missing (or cannot be timed): every later job would fail the same
            # way here, burning its attempts. Hand this one back for another worker and stop.
            self.device_lost = _error(result)
            log.error(
                "job %d: device %s unusable (%s); stopping",
                job.job_id,
                self.device,
                self.device_lost,
            )
            self.stop()
            return self._fail(job, f"worker {self.id}: {self.device_lost}", True, run_s)
        if result.timed_out and self.stopped_at_budget(job):
            return self._fail(job, with_stacks(overran(job.budget_s), result.stacks), False, run_s)
        if not result.ok:
            return self._fail(job, _error(result), _retryable(result), run_s)
        try:
            files = (
                result_files(out / "report.json")
                if job.world_size == 1
                else rank_result_files(out, job.world_size)
            )
        except ValueError as exc:
            return self._fail(job, f"the tuner finished but {exc}", False, run_s)
        beat.update(1.0, "uploading the result")
        outcome = self._complete(job, files, run_s)
        if outcome.status == "succeeded":
            self.merge_caches(job, out)
        return outcome

    def merge_caches(self, job: Assignment, out: Path) -> None:
        """What the job measured, into the shared caches, once the service accepted its result:
        only records that pass `tuner.host.job_caches.merge_job`'s checks, for the hardware this
        worker's own probe found."""
        mine = self.hardware.get("key")
        store = self.settings.worker_decision_cache
        merged = job_caches.merge_job(out, store, mine if isinstance(mine, str) else "unknown")
        if merged.refused:
            log.warning(
                "job %d: %d cache record(s) refused: %s",
                job.job_id,
                len(merged.refused),
                "; ".join(merged.refused[:3]),
            )
        log.debug(
            "job %d: kept %d decision(s), %d compile time(s)",
            job.job_id,
            merged.decisions,
            merged.compile_times,
        )

    def download(self, job: Assignment, workdir: Path) -> Path:
        """The uploaded program; for a distributed job every rank's, as `input_rank{rank}.pt2`."""
        if job.world_size == 1:
            return self.client.download(job, workdir / "input.pt2")
        if len(job.ranks) != job.world_size:
            raise ServiceError(f"job {job.job_id} names {len(job.ranks)} of its ranks' programs")
        for rank, file in enumerate(job.ranks):
            self.client.download_file(file, workdir / RANK_INPUT.format(rank=rank), job.lease_token)
        return workdir / RANK_INPUT

    def command(self, job: Assignment, source: Path, out: Path, workdir: Path) -> list[str]:
        if job.world_size > 1:
            return self.distributed_command(job, source, out)
        cmd = [
            *self.settings.worker_tune_command,
            str(source),
            "--device",
            str(self.device),
            "--out",
            str(out / "tuned.pt2"),
            "--report",
            str(out / "report.json"),
            "--progress-json",
            "--no-sandbox",  # it runs in this worker's (`sandbox`)
        ]
        if job.budget_s is not None:
            cmd += ["--budget-s", f"{job.budget_s:g}"]
        for dim, sizes in (job.sizes or {}).items():
            cmd += ["--sizes", f"{dim}={','.join(str(s) for s in sizes)}"]
        if job.mode != "infer":
            cmd += ["--mode", job.mode]
        if job.optimizer is not None:
            cmd += ["--optimizer", job.optimizer]
        cache = job_caches.snapshot(self.settings.worker_decision_cache, workdir / CACHE_IN)
        cmd += ["--cache", str(cache), "--cache-out", str(out / CACHE_OUT)]
        if self.settings.worker_tune_threads is not None:
            cmd += ["--threads", str(self.settings.worker_tune_threads)]
        return cmd

    def distributed_command(self, job: Assignment, source: Path, out: Path) -> list[str]:
        """`fxtune tune --world-size N`: the ranks are spawned inside the job's sandbox and
        talk over its loopback (gloo); every rank writes `tuned_rank{rank}.pt2`."""
        cmd = [
            *self.settings.worker_tune_command,
            str(source),
            "--device",
            str(self.device),
            "--world-size",
            str(job.world_size),
            "--out",
            str(out / RANK_OUTPUT),
            "--report",
            str(out / "report.json"),
            "--no-sandbox",
        ]
        if job.budget_s is not None:
            cmd += ["--budget-s", f"{job.budget_s:g}"]
        if self.settings.worker_tune_threads is not None:
            cmd += ["--threads", str(self.settings.worker_tune_threads)]
        return cmd

    def limits(self, job: Assignment) -> Limits:
        """Killed at its budget plus `tuner.contract.budget.KILL_MARGIN_S` (or the worker's
        timeout, if shorter)."""
        # No CPU-time limit: the wall timeout already ends the job's process group, and under
        # RLIMIT_CPU Linux reads the process CPU clock from ticks (4 ms steps), which the
        # tuner then cannot time with beside other work (`tuner.measure.timing.FINE_CLOCK_NS`).
        wall_s = min(self.settings.worker_timeout_s, kill_after_s(job.budget_s))
        if job.device != "cpu":  # CUDA reserves huge virtual ranges; RLIMIT_AS would break it
            return Limits(wall_s=wall_s)
        return dataclasses.replace(self.cpu_limits(), wall_s=wall_s)

    def stopped_at_budget(self, job: Assignment) -> bool:
        """Whether a timed-out job was stopped by its budget (its fault: not retried), not by
        the worker's own timeout."""
        return kill_after_s(job.budget_s) <= self.settings.worker_timeout_s

    def cpu_limits(self) -> Limits:
        """A CPU job's limits; the warm-up build's too (it compiles on the CPU)."""
        mb, share = self.settings.worker_memory_mb, self.settings.worker_memory_fraction
        address_space = mb * 1024 * 1024 if mb else int(physical_memory_bytes() * share)
        return Limits(wall_s=self.settings.worker_timeout_s, address_space_bytes=address_space)

    def sandbox(self, job: Assignment, workdir: Path) -> Sandbox:
        """The job's isolation: nothing writable but its own folder, where the snapshot of the
        shared caches it reads is bound read-only (`tuner.host.job_caches`)."""
        read_only = (workdir / CACHE_IN,) if job.world_size == 1 else ()
        return Sandbox(self.sandbox_kind, read_only=read_only, share_devices=job.device != "cpu")

    def child_env(self) -> dict[str, str]:
        """The operator's extra variables for the child (FXTUNE_WORKER_CHILD_ENV), if set here;
        the allowlist itself is `tuner.host.child_env`."""
        names = self.settings.worker_child_env
        return {name: os.environ[name] for name in names if name in os.environ}

    def _complete(
        self, job: Assignment, files: dict[str, Path], run_s: float | None = None
    ) -> Outcome:
        for attempt in range(3):
            try:
                self.client.complete(job, files, run_s)
                return Outcome("succeeded")
            except LeaseLost as exc:
                return Outcome("lost", f"result refused: {exc}")
            except ServiceError as exc:
                # A 5xx is the service's fault (its check failed): another attempt may pass.
                why = "could not check" if exc.servers_fault else "refused"
                return self._fail(
                    job, f"the service {why} the result: {exc}", exc.servers_fault, run_s
                )
            except httpx.TransportError as exc:
                log.warning("job %d: upload failed (%s); retrying", job.job_id, exc)
                self._stop.wait(2**attempt)
        return Outcome("failed", "could not upload the result; the lease will expire")

    def _fail(
        self, job: Assignment, error: str, retryable: bool, run_s: float | None = None
    ) -> Outcome:
        error = self.redact(error, MAX_ERROR_CHARS)
        try:
            self.client.fail(job, error, retryable, run_s)
        except LeaseLost:
            return Outcome("lost", error)
        except (httpx.HTTPError, ServiceError) as exc:
            log.warning("job %d: could not report the failure (%s)", job.job_id, exc)
        return Outcome("failed", error)


def _error(result: ChildResult) -> str:
    if result.cancelled:
        return with_stacks("the worker was stopped before the job finished", result.stacks)
    return result.error or f"tuner exited with status {result.returncode}"


def _retryable(result: ChildResult) -> bool:
    return result.timed_out or result.cancelled or result.returncode not in PERMANENT_EXITS


def result_files(report_path: Path) -> dict[str, Path]:
    """The files to upload, from report.json's `artifacts`; each must lie in the report's folder."""
    if not report_path.is_file():
        raise ValueError("wrote no report.json")
    try:
        artifacts = json.loads(report_path.read_text())["artifacts"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"report.json is unreadable: {exc!r}") from None
    root = report_path.parent.resolve()
    files = {"report": report_path}
    named: dict[str, Any] = {
        "program": artifacts.get("program"),
        "aoti": artifacts.get("aoti"),
        "runtime": artifacts.get("runtime"),  # an ONNX file or an OpenVINO IR zip
    }
    for kind, rel in (artifacts.get("traces") or {}).items():
        if kind in ("baseline", "tuned"):
            named[f"trace_{kind}"] = rel
    for field, rel in named.items():
        if not rel:
            continue
        path = (root / rel).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise ValueError(f"its report names a missing or outside file for {field}: {rel}")
        files[field] = path
    if "program" not in files:
        raise ValueError("its report names no tuned program")
    return files


def rank_result_files(out: Path, world_size: int) -> dict[str, Path]:
    """A distributed job's upload: its report, and rank r's tuned program as `program` (rank 0)
    or `program_rank{r}` (the service stores each as the tuned program of rank r's model)."""
    files = {"report": out / "report.json"}
    for rank in range(world_size):
        files["program" if rank == 0 else f"program_rank{rank}"] = out / RANK_OUTPUT.format(
            rank=rank
        )
    missing = [f"{name} ({path.name})" for name, path in files.items() if not path.is_file()]
    if missing:
        raise ValueError(f"wrote no {', '.join(missing)}")
    return files


def install_signal_handlers(stop: Callable[[], None]) -> None:
    def handler(signum: int, _frame: object) -> None:
        log.warning("received %s; stopping after cleaning up", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
