"""Request and response bodies of the HTTP API (the contract in DESIGN.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from service.store import ConfigSummary, Job, Model
from tuner.contract.config import Mode
from tuner.contract.device import KINDS
from tuner.contract.training import OPTIMIZER_NAMES

# The tuner's registry of device kinds, so the API accepts exactly what workers can tune on; a
# job targets a kind, never one GPU ("cuda:1" is the worker's choice). A Literal keeps the enum
# in the OpenAPI schema.
Device = Literal[tuple(KINDS)]  # type: ignore[valid-type]
# Ids are 64-bit in every database; a larger number is a 422 here, never an overflow below.
INT64_MAX = 2**63 - 1
IdPath = Annotated[int, Path(ge=1, le=INT64_MAX)]
IdQuery = Annotated[int | None, Query(ge=1, le=INT64_MAX)]
Limit = Annotated[int, Query(ge=1, le=1000)]
Offset = Annotated[int, Query(ge=0, le=INT64_MAX)]
Budget = Field(default=None, gt=0, le=7 * 24 * 3600, description="Tuning time budget, seconds")
MAX_WORLD_SIZE = 64  # ranks of one distributed job (each rank is a process on one worker)
Optimizer = Literal[OPTIMIZER_NAMES]  # type: ignore[valid-type]
ModeField = Field(
    default="infer",
    description='"train": tune a training step (forward, loss, backward, and the optimizer '
    "step when one is named) of a program exported in train mode",
)
OptimizerField = Field(
    default=None, description='With mode "train": one optimizer step per timed step'
)


ModeQuery = Annotated[
    Mode, Query(description='The config\'s mode: "infer" (default) or "train" (a training step)')
]


def check_training_request(mode: str, optimizer: str | None) -> None:
    """An optimizer only makes sense for a training step."""
    if optimizer is not None and mode != "train":
        raise ValueError('optimizer needs mode "train"')


class ConfigSummaryOut(BaseModel):
    device: str
    mode: Mode = "infer"
    hardware_key: str
    fingerprint: str
    backend: str | None
    speedup: float | None
    etag: str
    has_aoti: bool
    job_id: int | None
    updated_at: datetime

    @classmethod
    def of(cls, c: ConfigSummary) -> ConfigSummaryOut:
        return cls(
            device=c.device,
            mode=c.mode,  # type: ignore[arg-type]  # the database's check constraint
            hardware_key=c.hardware_key,
            fingerprint=c.fingerprint,
            backend=c.backend,
            speedup=c.speedup,
            etag=c.etag,
            has_aoti=c.has_aoti,
            job_id=c.job_id,
            updated_at=c.updated_at,
        )


# Dynamic dimension name -> sizes to tune at (tuner.graph.sizes); bounded so a job stays small.
Sizes = dict[
    Annotated[str, StringConstraints(min_length=1, max_length=64)],
    Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=16)],
]


class JobOut(BaseModel):
    id: int
    model_id: int
    device: str
    status: Literal["queued", "running", "succeeded", "failed"]
    budget_s: float | None
    sizes: dict[str, list[int]] | None = None
    world_size: int = 1
    rank_models: list[int] | None = Field(
        default=None, description="A distributed job's model per rank (rank 0 is model_id)"
    )
    mode: Mode = "infer"
    optimizer: str | None = None
    attempts: int
    max_attempts: int
    progress: float
    message: str | None
    error: str | None
    worker_id: str | None
    worker_sandbox: str | None = Field(
        default=None,
        description='The sandbox the claiming worker declared: "bwrap", or "none" (its '
        "operator chose to tune without one)",
    )
    lease_expires_at: datetime | None
    not_before: datetime | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    run_seconds: list[float] | None = Field(
        default=None,
        description="Wall time of each attempt's tuning run that its worker reported, seconds "
        "(a run is stopped at its budget plus 60 s)",
    )

    @classmethod
    def of(cls, j: Job) -> JobOut:
        return cls.model_validate(j, from_attributes=True)


class ModelOut(BaseModel):
    id: int
    sha256: str
    name: str
    size_bytes: int
    fingerprint: str | None
    created_at: datetime
    configs: list[ConfigSummaryOut] = []
    job: JobOut | None = Field(default=None, description="The tuning job, when one was asked for")

    @classmethod
    def of(cls, m: Model, configs: list[ConfigSummary] = (), job: Job | None = None) -> ModelOut:
        return cls(
            id=m.id,
            sha256=m.sha256,
            name=m.name,
            size_bytes=m.size_bytes,
            fingerprint=m.fingerprint,
            created_at=m.created_at,
            configs=[ConfigSummaryOut.of(c) for c in configs],
            job=JobOut.of(job) if job else None,
        )


class UploadOptions(BaseModel):
    """Form fields (or query parameters) that may come with an upload."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, min_length=1, max_length=255)
    tune: bool = False
    device: Device = "cpu"
    budget_s: float | None = Budget
    mode: Mode = ModeField
    optimizer: Optimizer | None = OptimizerField

    @model_validator(mode="after")
    def _optimizer_trains(self) -> UploadOptions:
        check_training_request(self.mode, self.optimizer)
        return self


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    device: Device
    budget_s: float | None = Budget
    sizes: Sizes | None = Field(
        default=None,
        description='Sizes to tune dynamic dimensions at, e.g. {"batch": [1, 32, 512]}; '
        "default: each dimension's minimum, the example and a large value",
    )
    world_size: int = Field(
        default=1,
        ge=1,
        le=MAX_WORLD_SIZE,
        description="Ranks of a distributed job (> 1: tuned by `fxtune tune --world-size N` on a "
        "worker that declares at least N ranks)",
    )
    rank_models: list[Annotated[int, Field(ge=1, le=INT64_MAX)]] | None = Field(
        default=None,
        max_length=MAX_WORLD_SIZE,
        description="With world_size N > 1: the uploaded model of every rank, in rank order; "
        "the first is the model in the path, and all must share one fingerprint",
    )
    mode: Mode = ModeField
    optimizer: Optimizer | None = OptimizerField

    @model_validator(mode="after")
    def _ranks_named(self) -> JobCreate:
        check_training_request(self.mode, self.optimizer)
        if self.mode == "train" and (self.world_size > 1 or self.sizes):
            raise ValueError(
                'mode "train" tunes one process at the example size: world_size > 1 and '
                "sizes are not supported with it yet"
            )
        if self.world_size == 1 and self.rank_models not in (None, []):
            raise ValueError("rank_models needs world_size > 1")
        if self.world_size > 1:
            if self.rank_models is None or len(self.rank_models) != self.world_size:
                raise ValueError(f"world_size {self.world_size} needs that many rank_models")
            if self.sizes:
                raise ValueError("sizes are not supported with world_size > 1 (yet)")
        return self


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker_id: str = Field(min_length=1, max_length=255)
    device: Device
    hardware: dict[str, Any] = Field(default_factory=dict)
    ranks: int = Field(
        default=1, ge=1, le=MAX_WORLD_SIZE, description="Ranks this worker can run at once"
    )


class ModelRef(BaseModel):
    id: int
    sha256: str
    size_bytes: int
    name: str


class RankProgram(BaseModel):
    rank: int
    model: ModelRef
    artifact_url: str


class ClaimOut(BaseModel):
    job: JobOut
    lease_token: str
    lease_s: float
    model: ModelRef
    artifact_url: str = Field(description="Where to download the uploaded program (GET)")
    ranks: list[RankProgram] = Field(
        default_factory=list, description="A distributed job's program per rank (else empty)"
    )


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lease_token: str = Field(min_length=1, max_length=64)
    progress: float | None = Field(default=None, ge=0, le=1)
    message: str | None = Field(default=None, max_length=2000)


class FailIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lease_token: str = Field(min_length=1, max_length=64)
    error: str = Field(min_length=1, max_length=20000)
    retryable: bool = Field(
        default=True, description="False for errors another attempt cannot fix (bad model)"
    )
    run_s: float | None = Field(default=None, ge=0, le=1e7, description="The run's wall time")


class Health(BaseModel):
    status: Literal["ok"]
    schema_revision: str


class UseOut(BaseModel):
    used: int
    limit: int | None = Field(description="None: no limit")


class ChecksOut(BaseModel):
    running: int = Field(description="Checks of uploads and results running now")
    waiting: int = Field(description="Checks waiting for a slot")
    slots: int = Field(description="Checks that may run at once")
    queue: int = Field(description="Upload checks that may wait; past it an upload gets 503")


class QuotaOut(BaseModel):
    """The caller's use of its quotas (FXTUNE_QUOTA_*) and the service's check slots."""

    identity: str = Field(description='A hash of the caller\'s token, or "loopback"')
    active_jobs: UseOut = Field(description="Jobs queued or running")
    stored_bytes: UseOut = Field(description="Bytes of the uploads stored for this caller")
    uploads_per_minute: UseOut = Field(description="Uploads started in the last 60 s")
    checks: ChecksOut | None = Field(description="None: this service runs checks unbounded")
