"""The tracking-store interface the API is written against (MLflow's shape: abstract + SQL)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime
from typing import Any

from service.store.entities import (
    Claim,
    ConfigSummary,
    Job,
    Model,
    OwnerUsage,
    QueuePolicy,
    StoredConfig,
    TuningResult,
)


class AbstractStore(ABC):
    """Models, the job queue and tuned configs. Every method is one transaction."""

    policy: QueuePolicy

    @abstractmethod
    def add_model(
        self,
        sha256: str,
        name: str,
        size_bytes: int,
        fingerprint: str | None = None,
        owner: str | None = None,
        max_owner_bytes: int | None = None,
    ) -> tuple[Model, bool]:
        """Register uploaded bytes; the same sha256 again returns the existing model (False).

        New bytes are charged to `owner`; OverQuota where they would take its stored bytes
        past `max_owner_bytes` (checked and charged in one transaction)."""

    @abstractmethod
    def owner_usage(self, owner: str) -> OwnerUsage:
        """The active jobs and stored upload bytes charged to `owner`."""

    @abstractmethod
    def get_model(self, model_id: int) -> Model: ...

    @abstractmethod
    def model_with_sha256(self, sha256: str) -> Model | None:
        """The model these bytes were uploaded as, if any (its upload was checked then)."""

    @abstractmethod
    def set_fingerprint(self, model_id: int, fingerprint: str) -> Model:
        """Record the fingerprint of a model stored before uploads were fingerprinted."""

    @abstractmethod
    def list_models(self, limit: int = 100, offset: int = 0) -> list[Model]: ...

    @abstractmethod
    def enqueue_job(
        self,
        model_id: int,
        device: str,
        budget_s: float | None,
        sizes: dict[str, list[int]] | None = None,
        world_size: int = 1,
        rank_models: list[int] | None = None,
        mode: str = "infer",
        optimizer: str | None = None,
        owner: str | None = None,
        max_owner_active: int | None = None,
    ) -> tuple[Job, bool]:
        """Queue a tuning job; an unfinished job for the same model, device, ranks, mode and
        optimizer is reused.

        A distributed job (`world_size` > 1) names every rank's model, rank 0's first. A new
        job is charged to `owner`; OverQuota where its queued and running jobs would pass
        `max_owner_active` (a reused job adds nothing)."""

    @abstractmethod
    def get_job(self, job_id: int) -> Job: ...

    @abstractmethod
    def list_jobs(
        self,
        status: str | None = None,
        model_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Job]: ...

    @abstractmethod
    def claim_job(
        self,
        device: str,
        worker_id: str,
        hardware: dict[str, Any],
        now: datetime | None = None,
        ranks: int = 1,
    ) -> Claim | None:
        """Lease the oldest ready job for `device` needing at most `ranks` ranks, or None."""

    @abstractmethod
    def heartbeat(
        self,
        job_id: int,
        lease_token: str,
        progress: float | None,
        message: str | None,
        now: datetime | None = None,
    ) -> Job:
        """Extend the lease; raises StaleLease when the token is not the current one."""

    @abstractmethod
    def check_lease(self, job_id: int, lease_token: str) -> Job: ...

    @abstractmethod
    def complete_job(
        self,
        job_id: int,
        lease_token: str,
        result: TuningResult,
        now: datetime | None = None,
        other_ranks: dict[int, TuningResult] | None = None,
        run_s: float | None = None,
    ) -> tuple[Job, StoredConfig]:
        """Store the job's config; `other_ranks` (model id -> result): a distributed job's
        configs for ranks 1.. (their own models), stored in the same transaction. `run_s`: the
        attempt's wall time, added to the job's `run_seconds`."""

    @abstractmethod
    def fail_job(
        self,
        job_id: int,
        lease_token: str,
        error: str,
        retryable: bool,
        now: datetime | None = None,
        run_s: float | None = None,
    ) -> Job:
        """Record a failed attempt: requeue with backoff while attempts remain, else `failed`;
        `run_s` as for `complete_job`."""

    @abstractmethod
    def requeue_expired(self, now: datetime | None = None) -> int:
        """Reap leases whose worker went silent; returns how many jobs it touched."""

    @abstractmethod
    def get_config(
        self,
        model_id: int,
        device: str,
        hardware_key: str | None = None,
        details: bool = False,
        mode: str = "infer",
    ) -> StoredConfig:
        """The newest config for the target; `details` adds site decisions and profiles."""

    @abstractmethod
    def get_config_by_fingerprint(
        self,
        fingerprint: str,
        device: str,
        hardware_key: str | None = None,
        details: bool = False,
        mode: str = "infer",
    ) -> StoredConfig: ...

    @abstractmethod
    def list_configs(self, model_ids: list[int] | None = None) -> list[ConfigSummary]: ...
