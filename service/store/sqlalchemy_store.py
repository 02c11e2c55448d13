"""The store on SQLAlchemy: SQLite for one machine, PostgreSQL for many workers."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Engine, func, or_, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from service.db.engine import IMMEDIATE
from service.db.models import (
    JobRow,
    ModelRow,
    ProfileRow,
    TunedConfigRow,
    utcnow,
)
from service.store.abstract import AbstractStore
from service.store.entities import (
    Claim,
    ConfigSummary,
    Job,
    Model,
    OwnerUsage,
    Profile,
    QueuePolicy,
    StoredConfig,
    TuningResult,
)
from service.store.errors import NotFound, OverQuota, StaleLease

T = TypeVar("T")
ACTIVE = ("queued", "running")


class SqlAlchemyStore(AbstractStore):
    def __init__(self, engine: Engine, policy: QueuePolicy | None = None) -> None:
        self.engine = engine
        self.policy = policy or QueuePolicy()

    @contextmanager
    def _tx(self, write: bool = False) -> Iterator[Session]:
        """One transaction; writes on SQLite take the write lock up front (BEGIN IMMEDIATE)."""
        with Session(self.engine, expire_on_commit=False) as session:
            session.connection(execution_options={IMMEDIATE: write})
            yield session
            session.commit()

    def _retry_on_conflict(self, fn: Callable[[], T]) -> T:
        """Run `fn` again once when a concurrent insert won a unique-key race."""
        try:
            return fn()
        except IntegrityError:
            return fn()

    # models

    def add_model(
        self,
        sha256: str,
        name: str,
        size_bytes: int,
        fingerprint: str | None = None,
        owner: str | None = None,
        max_owner_bytes: int | None = None,
    ) -> tuple[Model, bool]:
        def attempt() -> tuple[Model, bool]:
            with self._tx(write=True) as s:
                row = s.scalars(select(ModelRow).where(ModelRow.sha256 == sha256)).first()
                if row is not None:
                    if row.fingerprint is None and fingerprint is not None:
                        row.fingerprint = fingerprint  # a row from before uploads were loaded
                    return _model(row), False
                if owner is not None and max_owner_bytes is not None:
                    _lock_owner(s, owner)
                    stored = _stored_bytes(s, owner)
                    if stored + size_bytes > max_owner_bytes:
                        raise OverQuota(
                            f"storing these {_mib(size_bytes)} would take this token's uploads "
                            f"to {_mib(stored + size_bytes)}, past its quota of "
                            f"{_mib(max_owner_bytes)} (FXTUNE_QUOTA_STORED_MB); nothing was "
                            "stored",
                            "stored_bytes",
                        )
                row = ModelRow(
                    sha256=sha256,
                    name=name,
                    size_bytes=size_bytes,
                    fingerprint=fingerprint,
                    owner=owner,
                )
                s.add(row)
                s.flush()
                return _model(row), True

        return self._retry_on_conflict(attempt)

    def get_model(self, model_id: int) -> Model:
        with self._tx() as s:
            return _model(_get(s, ModelRow, model_id, "model"))

    def model_with_sha256(self, sha256: str) -> Model | None:
        with self._tx() as s:
            row = s.scalars(select(ModelRow).where(ModelRow.sha256 == sha256)).first()
            return None if row is None else _model(row)

    def set_fingerprint(self, model_id: int, fingerprint: str) -> Model:
        with self._tx(write=True) as s:
            row = _get(s, ModelRow, model_id, "model", lock=True)
            if row.fingerprint is None:
                row.fingerprint = fingerprint
            return _model(row)

    def owner_usage(self, owner: str) -> OwnerUsage:
        with self._tx() as s:
            active = s.scalar(
                select(func.count())
                .select_from(JobRow)
                .where(JobRow.owner == owner, JobRow.status.in_(ACTIVE))
            )
            return OwnerUsage(active_jobs=active or 0, stored_bytes=_stored_bytes(s, owner))

    def list_models(self, limit: int = 100, offset: int = 0) -> list[Model]:
        with self._tx() as s:
            q = select(ModelRow).order_by(ModelRow.id.desc()).limit(limit).offset(offset)
            return [_model(r) for r in s.scalars(q)]

    # jobs

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
        with self._tx(write=True) as s:
            # Locking the model row serialises enqueues per model, so "reuse the active job"
            # cannot race into two jobs on PostgreSQL.
            _get(s, ModelRow, model_id, "model", lock=True)
            # JSON has no equality in PostgreSQL: the (few) active jobs are matched here.
            active = next(
                (
                    j
                    for j in s.scalars(
                        select(JobRow)
                        .where(
                            JobRow.model_id == model_id,
                            JobRow.device == device,
                            JobRow.status.in_(ACTIVE),
                            JobRow.world_size == world_size,
                            JobRow.mode == mode,
                        )
                        .order_by(JobRow.id)
                    )
                    if j.rank_models == rank_models and j.optimizer == optimizer
                ),
                None,
            )
            if active is not None:
                return _job(active), False
            if owner is not None and max_owner_active is not None:
                _lock_owner(s, owner)
                count = s.scalar(
                    select(func.count())
                    .select_from(JobRow)
                    .where(JobRow.owner == owner, JobRow.status.in_(ACTIVE))
                )
                if (count or 0) >= max_owner_active:
                    raise OverQuota(
                        f"this token has {count} jobs queued or running, its quota "
                        f"(FXTUNE_QUOTA_ACTIVE_JOBS={max_owner_active}); queue more once some "
                        "have finished",
                        "active_jobs",
                    )
            row = JobRow(
                owner=owner,
                model_id=model_id,
                device=device,
                budget_s=budget_s,
                sizes=sizes,
                world_size=world_size,
                rank_models=rank_models,
                mode=mode,
                optimizer=optimizer,
                status="queued",
                attempts=0,
                max_attempts=self.policy.max_attempts,
                progress=0.0,
                message="queued",
            )
            s.add(row)
            s.flush()
            return _job(row), True

    def get_job(self, job_id: int) -> Job:
        with self._tx() as s:
            return _job(_get(s, JobRow, job_id, "job"))

    def list_jobs(
        self,
        status: str | None = None,
        model_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Job]:
        q = select(JobRow).order_by(JobRow.id.desc()).limit(limit).offset(offset)
        if status is not None:
            q = q.where(JobRow.status == status)
        if model_id is not None:
            q = q.where(JobRow.model_id == model_id)
        with self._tx() as s:
            return [_job(r) for r in s.scalars(q)]

    def claim_job(
        self,
        device: str,
        worker_id: str,
        hardware: dict[str, Any],
        now: datetime | None = None,
        ranks: int = 1,
    ) -> Claim | None:
        now = now or utcnow()
        with self._tx(write=True) as s:
            self._reap(s, now)
            row = s.scalars(
                select(JobRow)
                .where(
                    JobRow.status == "queued",
                    JobRow.device == device,
                    JobRow.world_size <= ranks,
                    or_(JobRow.not_before.is_(None), JobRow.not_before <= now),
                )
                .order_by(JobRow.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                return None
            row.status = "running"
            row.attempts += 1
            row.lease_token = secrets.token_hex(16)
            row.lease_expires_at = now + timedelta(seconds=self.policy.lease_s)
            row.worker_id = worker_id[:255]
            row.worker_hardware = hardware
            row.started_at = now
            row.progress = 0.0
            row.message = f"attempt {row.attempts} of {row.max_attempts} on {worker_id}"[:500]
            s.flush()
            model = _get(s, ModelRow, row.model_id, "model")
            return Claim(_job(row), row.lease_token, self.policy.lease_s, model.sha256)

    def heartbeat(
        self,
        job_id: int,
        lease_token: str,
        progress: float | None,
        message: str | None,
        now: datetime | None = None,
    ) -> Job:
        now = now or utcnow()
        with self._tx(write=True) as s:
            row = _leased(s, job_id, lease_token)
            row.lease_expires_at = now + timedelta(seconds=self.policy.lease_s)
            if progress is not None:
                row.progress = min(1.0, max(0.0, progress))
            if message:
                row.message = message[:500]
            s.flush()
            return _job(row)

    def check_lease(self, job_id: int, lease_token: str) -> Job:
        with self._tx() as s:
            return _job(_leased(s, job_id, lease_token, lock=False))

    def complete_job(
        self,
        job_id: int,
        lease_token: str,
        result: TuningResult,
        now: datetime | None = None,
        other_ranks: dict[int, TuningResult] | None = None,
        run_s: float | None = None,
    ) -> tuple[Job, StoredConfig]:
        now = now or utcnow()

        def attempt() -> tuple[Job, StoredConfig]:
            with self._tx(write=True) as s:
                job = _leased(s, job_id, lease_token)
                # The model's fingerprint was computed from its upload; a result never changes it.
                config = self._upsert_config(s, job, result)
                for model_id, rank_result in (other_ranks or {}).items():
                    self._upsert_config(s, job, rank_result, model_id)
                job.status = "succeeded"
                job.progress = 1.0
                job.message = "done"
                job.error = None
                job.lease_token = None
                job.lease_expires_at = None
                job.finished_at = now
                _add_run(job, run_s)
                s.flush()
                return _job(job), _config(config)

        return self._retry_on_conflict(attempt)

    def _upsert_config(
        self, s: Session, job: JobRow, result: TuningResult, model_id: int | None = None
    ) -> TunedConfigRow:
        model_id = job.model_id if model_id is None else model_id
        row = s.scalars(
            select(TunedConfigRow)
            .where(
                TunedConfigRow.model_id == model_id,
                TunedConfigRow.device == job.device,
                TunedConfigRow.mode == result.mode,
                TunedConfigRow.hardware_key == result.hardware_key,
            )
            .with_for_update()
        ).first()
        if row is None:
            row = TunedConfigRow(
                model_id=model_id,
                device=job.device,
                mode=result.mode,
                hardware_key=result.hardware_key,
            )
            s.add(row)
        row.job_id = job.id
        row.hardware = result.hardware
        row.fingerprint = result.fingerprint
        row.backend = result.backend
        row.speedup = result.speedup
        row.config = result.config
        row.etag = result.etag
        row.program_sha256 = result.program_sha256
        row.aoti_sha256 = result.aoti_sha256
        row.report_sha256 = result.report_sha256
        # The old rows must be gone before the new ones go in: (config, kind) is unique.
        row.profiles.clear()
        s.flush()
        row.profiles = [
            ProfileRow(kind=p.kind, summary=p.summary, trace_sha256=p.trace_sha256)
            for p in result.profiles
        ]
        s.flush()
        return row

    def fail_job(
        self,
        job_id: int,
        lease_token: str,
        error: str,
        retryable: bool,
        now: datetime | None = None,
        run_s: float | None = None,
    ) -> Job:
        now = now or utcnow()
        with self._tx(write=True) as s:
            row = _leased(s, job_id, lease_token)
            _add_run(row, run_s)
            self._end_attempt(row, error, retryable, now)
            s.flush()
            return _job(row)

    def _end_attempt(self, row: JobRow, error: str, retryable: bool, now: datetime) -> None:
        row.error = error[:4000]
        row.lease_token = None
        row.lease_expires_at = None
        if retryable and row.attempts < row.max_attempts:
            delay = self.policy.delay_s(row.attempts)
            row.status = "queued"
            row.not_before = now + timedelta(seconds=delay)
            row.progress = 0.0
            row.message = (
                f"attempt {row.attempts} of {row.max_attempts} failed; retry in {delay:g}s"
            )
        else:
            row.status = "failed"
            row.finished_at = now
            row.message = f"failed after {row.attempts} attempt(s)"

    def requeue_expired(self, now: datetime | None = None) -> int:
        with self._tx(write=True) as s:
            return self._reap(s, now or utcnow())

    def _reap(self, s: Session, now: datetime) -> int:
        rows = s.scalars(
            select(JobRow)
            .where(JobRow.status == "running", JobRow.lease_expires_at < now)
            .order_by(JobRow.id)
            .with_for_update(skip_locked=True)
        ).all()
        for row in rows:
            lost = f"lease expired: worker {row.worker_id} stopped reporting"
            self._end_attempt(row, lost, retryable=True, now=now)
        s.flush()
        return len(rows)

    # configs

    def get_config(
        self,
        model_id: int,
        device: str,
        hardware_key: str | None = None,
        details: bool = False,
        mode: str = "infer",
    ) -> StoredConfig:
        q = select(TunedConfigRow).where(
            TunedConfigRow.model_id == model_id,
            TunedConfigRow.device == device,
            TunedConfigRow.mode == mode,
        )
        missing = f"no tuned {_mode_word(mode)}config for model {model_id} on {device}"
        return self._one_config(q, hardware_key, details, missing)

    def get_config_by_fingerprint(
        self,
        fingerprint: str,
        device: str,
        hardware_key: str | None = None,
        details: bool = False,
        mode: str = "infer",
    ) -> StoredConfig:
        q = select(TunedConfigRow).where(
            TunedConfigRow.fingerprint == fingerprint,
            TunedConfigRow.device == device,
            TunedConfigRow.mode == mode,
        )
        missing = f"no tuned {_mode_word(mode)}config for fingerprint {fingerprint} on {device}"
        return self._one_config(q, hardware_key, details, missing)

    def _one_config(
        self, q: Any, hardware_key: str | None, details: bool, missing: str
    ) -> StoredConfig:
        if hardware_key is not None:
            q = q.where(TunedConfigRow.hardware_key == hardware_key)
        q = q.order_by(TunedConfigRow.updated_at.desc(), TunedConfigRow.id.desc()).limit(1)
        if details:
            q = q.options(selectinload(TunedConfigRow.profiles))
        with self._tx() as s:
            row = s.scalars(q).first()
            if row is None:
                raise NotFound(missing)
            return _config(row, details)

    def list_configs(self, model_ids: list[int] | None = None) -> list[ConfigSummary]:
        q = select(TunedConfigRow).order_by(
            TunedConfigRow.model_id, TunedConfigRow.device, TunedConfigRow.mode
        )
        if model_ids is not None:
            q = q.where(TunedConfigRow.model_id.in_(model_ids))
        with self._tx() as s:
            return [_summary(r) for r in s.scalars(q)]


def _lock_owner(s: Session, owner: str) -> None:
    """Serialise quota checks of one owner until the transaction ends: PostgreSQL takes an
    advisory lock on a hash of the name; SQLite's write transactions are serial already."""
    if s.get_bind().dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(owner.encode()).digest()[:8], "big", signed=True)
        s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def _stored_bytes(s: Session, owner: str) -> int:
    total = s.scalar(select(func.sum(ModelRow.size_bytes)).where(ModelRow.owner == owner))
    return int(total or 0)


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _mode_word(mode: str) -> str:
    return "" if mode == "infer" else f"{mode}ing "


def _get(s: Session, cls: type[T], ident: int, what: str, lock: bool = False) -> T:
    row = s.get(cls, ident, with_for_update=lock)
    if row is None:
        raise NotFound(f"{what} {ident} not found")
    return row


def _leased(s: Session, job_id: int, token: str, lock: bool = True) -> JobRow:
    row = _get(s, JobRow, job_id, "job", lock=lock)
    # Bytes, not str: compare_digest refuses non-ASCII strings, and a token is client input.
    current = (row.lease_token or "").encode()
    if row.status != "running" or not secrets.compare_digest(current, token.encode()):
        raise StaleLease(
            f"job {job_id} is not leased to this token (status {row.status}, "
            f"attempt {row.attempts}); a newer attempt owns it or it has finished"
        )
    return row


def _model(r: ModelRow) -> Model:
    return Model(r.id, r.sha256, r.name, r.size_bytes, r.fingerprint, r.created_at)


def _add_run(row: JobRow, run_s: float | None) -> None:
    """Append an attempt's wall time (a new list: JSON columns see assignments, not edits)."""
    if run_s is not None:
        row.run_seconds = [*(row.run_seconds or []), round(run_s, 2)]


def _job(r: JobRow) -> Job:
    return Job(
        id=r.id,
        model_id=r.model_id,
        device=r.device,
        budget_s=r.budget_s,
        status=r.status,
        attempts=r.attempts,
        max_attempts=r.max_attempts,
        progress=r.progress,
        message=r.message,
        error=r.error,
        worker_id=r.worker_id,
        lease_expires_at=r.lease_expires_at,
        not_before=r.not_before,
        created_at=r.created_at,
        updated_at=r.updated_at,
        started_at=r.started_at,
        finished_at=r.finished_at,
        sizes=r.sizes,
        world_size=r.world_size,
        rank_models=r.rank_models,
        mode=r.mode,
        optimizer=r.optimizer,
        worker_hardware=r.worker_hardware,
        run_seconds=r.run_seconds,
    )


def _summary(r: TunedConfigRow) -> ConfigSummary:
    return ConfigSummary(
        id=r.id,
        model_id=r.model_id,
        job_id=r.job_id,
        device=r.device,
        hardware_key=r.hardware_key,
        fingerprint=r.fingerprint,
        backend=r.backend,
        speedup=r.speedup,
        etag=r.etag,
        has_aoti=r.aoti_sha256 is not None,
        updated_at=r.updated_at,
        mode=r.mode,
    )


def _config(r: TunedConfigRow, details: bool = True) -> StoredConfig:
    if not details:
        return StoredConfig(
            _summary(r), r.hardware, r.config, r.program_sha256, r.aoti_sha256, r.report_sha256
        )
    return StoredConfig(
        summary=_summary(r),
        hardware=r.hardware,
        config=r.config,
        program_sha256=r.program_sha256,
        aoti_sha256=r.aoti_sha256,
        report_sha256=r.report_sha256,
        profiles=tuple(Profile(p.kind, p.summary, p.trace_sha256) for p in r.profiles),
    )
