"""The schema. Alembic migrations under migrations/ are the only way it reaches a database."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

JOB_STATUSES = ("queued", "running", "succeeded", "failed")
DEVICES = ("cpu", "cuda", "xla")
PROFILE_KINDS = ("baseline", "tuned")
MODES = ("infer", "train")  # what a job tunes: inference, or a training step


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes on every backend (SQLite stores naive ones and forgets the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON, list[Any]: JSON}


class ModelRow(Base):
    __tablename__ = "models"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    fingerprint: Mapped[str | None] = mapped_column(String(64), index=True)
    # The caller identity its bytes are charged to (`service.api.identity`); None: stored
    # before quotas.
    owner: Mapped[str | None] = mapped_column(String(64), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    configs: Mapped[list[TunedConfigRow]] = relationship(back_populates="model")


class JobRow(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(f"status IN {JOB_STATUSES!r}", name="status"),
        CheckConstraint(f"mode IN {MODES!r}", name="mode"),
        Index("ix_jobs_claim", "status", "device", "not_before"),
        Index("ix_jobs_owner", "owner", "status"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    device: Mapped[str] = mapped_column(String(16))
    budget_s: Mapped[float | None] = mapped_column(Float)
    # Sizes to tune dynamic dimensions at ({"batch": [1, 32, 512]}); None: the tuner's default.
    sizes: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # Ranks of a distributed job; only a worker declaring at least this many may claim it.
    world_size: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # The uploaded program of each rank, in rank order (model ids; [0] is model_id); None: 1 rank.
    rank_models: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    mode: Mapped[str] = mapped_column(String(8), default="infer", server_default="infer")
    # With mode "train": the optimizer stepped in each timed step (None: gradients only).
    optimizer: Mapped[str | None] = mapped_column(String(16), nullable=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    lease_token: Mapped[str | None] = mapped_column(String(64))
    lease_expires_at: Mapped[datetime | None]
    not_before: Mapped[datetime | None]
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str | None] = mapped_column(String(500))
    error: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[str | None] = mapped_column(String(255))
    worker_hardware: Mapped[dict[str, Any] | None]
    # Seconds each attempt's tuning child ran, as its worker reported (None: none reported).
    run_seconds: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    # The caller identity that queued it, for its quota of active jobs; None: before quotas.
    owner: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]


class TunedConfigRow(Base):
    """The best config for one model, mode and kind of hardware; a newer run replaces it.

    Inference and training configs of one upload live side by side: a training step is tuned
    for other work than inference, so neither may replace the other."""

    __tablename__ = "tuned_configs"
    __table_args__ = (
        UniqueConstraint(
            "model_id", "device", "mode", "hardware_key", name="uq_tuned_configs_target"
        ),
        CheckConstraint(f"mode IN {MODES!r}", name="mode"),
        Index("ix_tuned_configs_lookup", "fingerprint", "device", "mode"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"))
    device: Mapped[str] = mapped_column(String(16))
    mode: Mapped[str] = mapped_column(String(8), default="infer", server_default="infer")
    hardware_key: Mapped[str] = mapped_column(String(255))
    hardware: Mapped[dict[str, Any]]
    fingerprint: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str | None] = mapped_column(String(32))
    speedup: Mapped[float | None] = mapped_column(Float)
    config: Mapped[dict[str, Any]]
    etag: Mapped[str] = mapped_column(String(80))
    program_sha256: Mapped[str] = mapped_column(String(64))
    aoti_sha256: Mapped[str | None] = mapped_column(String(64))
    report_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    model: Mapped[ModelRow] = relationship(back_populates="configs")
    profiles: Mapped[list[ProfileRow]] = relationship(
        cascade="all, delete-orphan", order_by="ProfileRow.kind"
    )


class ProfileRow(Base):
    __tablename__ = "profiles"
    __table_args__ = (UniqueConstraint("config_id", "kind", name="uq_profiles_config_kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    config_id: Mapped[int] = mapped_column(ForeignKey("tuned_configs.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    summary: Mapped[dict[str, Any]]
    trace_sha256: Mapped[str | None] = mapped_column(String(64))
