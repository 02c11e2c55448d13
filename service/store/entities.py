"""Plain immutable records the store hands out, so no ORM row outlives its session."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Model:
    id: int
    sha256: str
    name: str
    size_bytes: int
    fingerprint: str | None
    created_at: datetime


@dataclass(frozen=True)
class Job:
    id: int
    model_id: int
    device: str
    budget_s: float | None
    status: str
    attempts: int
    max_attempts: int
    progress: float
    message: str | None
    error: str | None
    worker_id: str | None
    lease_expires_at: datetime | None
    not_before: datetime | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    sizes: dict[str, list[int]] | None = None  # sizes to tune dynamic dims at (None: default)
    world_size: int = 1  # ranks of a distributed job
    rank_models: list[int] | None = None  # each rank's uploaded program (model ids, rank order)
    mode: str = "infer"  # "train": a training step is tuned (tuner.tuning.train)
    optimizer: str | None = None  # with mode "train": stepped each timed step (None: none)
    worker_hardware: dict[str, Any] | None = None  # what the last claiming worker declared
    run_seconds: list[float] | None = None  # each reported attempt's tuning child, seconds

    @property
    def worker_sandbox(self) -> str | None:
        """The sandbox the claiming worker declared ("bwrap", "none"); None: not declared."""
        value = (self.worker_hardware or {}).get("sandbox")
        return str(value)[:16] if value is not None else None


@dataclass(frozen=True)
class Claim:
    """A job handed to one worker; only the holder of `lease_token` may report on it."""

    job: Job
    lease_token: str
    lease_s: float
    model_sha256: str


@dataclass(frozen=True)
class Profile:
    kind: str
    summary: dict[str, Any]
    trace_sha256: str | None


@dataclass(frozen=True)
class ConfigSummary:
    id: int
    model_id: int
    job_id: int | None
    device: str
    hardware_key: str
    fingerprint: str
    backend: str | None
    speedup: float | None
    etag: str
    has_aoti: bool
    updated_at: datetime
    mode: str = "infer"


@dataclass(frozen=True)
class StoredConfig:
    """A tuned config as stored: its summary row, the config JSON (the one source of every
    per-site decision) and the stored artifacts. `tuner.contract.config.TunedConfig` is the JSON's
    schema."""

    summary: ConfigSummary
    hardware: dict[str, Any]
    config: dict[str, Any]
    program_sha256: str
    aoti_sha256: str | None
    report_sha256: str
    profiles: tuple[Profile, ...] = ()


@dataclass(frozen=True)
class TuningResult:
    """What a successful job stores: the config with its parsed parts and stored artifacts."""

    config: dict[str, Any]
    fingerprint: str
    hardware: dict[str, Any]
    hardware_key: str
    backend: str | None
    speedup: float | None
    etag: str
    program_sha256: str
    aoti_sha256: str | None
    report_sha256: str
    profiles: tuple[Profile, ...] = ()
    mode: str = "infer"
    optimizer: str | None = None  # a training config's optimizer (None: gradients only)


@dataclass(frozen=True)
class OwnerUsage:
    """What one caller identity holds: the quotas' measure (`service.quotas`)."""

    active_jobs: int  # queued or running
    stored_bytes: int  # of the uploads it stored first (the same bytes again add nothing)


@dataclass(frozen=True)
class QueuePolicy:
    """Lease length, attempts per job and the exponential backoff between attempts."""

    lease_s: float = 60.0
    max_attempts: int = 3
    backoff_s: float = 10.0
    backoff_max_s: float = 600.0

    def delay_s(self, attempts: int) -> float:
        return min(self.backoff_max_s, self.backoff_s * 2 ** max(0, attempts - 1))
