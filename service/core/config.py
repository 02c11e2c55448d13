"""Service settings, read from `FXTUNE_*` environment variables (the deployment contract)."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


def default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "fxtune"


class Settings(BaseSettings):
    """Everything the service reads from its environment; `FXTUNE_<FIELD>` sets a field."""

    model_config = SettingsConfigDict(env_prefix="FXTUNE_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    api_token: SecretStr | None = None
    worker_token: SecretStr | None = Field(
        default=None,
        description="Bearer token of workers (claim, heartbeat, fail, complete); the user "
        "token is refused there. Unset with FXTUNE_API_TOKEN unset: loopback workers only",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names (or name:port) this service answers to besides its loopback "
        "and bound addresses, comma-separated; '*' turns the Host check off",
    )
    config_cache_ttl_s: float = Field(
        default=2.0,
        ge=0,
        description="How long a cached config may be served before the database is asked "
        "again: the bound on staleness when several service processes share one database",
    )
    max_json_kb: int = Field(
        default=1024,
        gt=0,
        description="Cap on every request body that is not an upload or a result (the JSON "
        "routes); larger bodies get 413 before anything parses them",
    )
    max_upload_mb: float = Field(default=512, gt=0)
    max_result_mb: float = Field(default=2048, gt=0)
    lease_s: float = Field(default=60, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    retry_backoff_s: float = Field(default=10, ge=0)
    retry_backoff_max_s: float = Field(default=600, ge=0)
    reap_interval_s: float = Field(default=5, gt=0)
    analysis_memory_mb: int = Field(
        default=8192,
        ge=512,
        description="Address-space cap of the child that checks an uploaded or tuned program",
    )
    analysis_cpu_s: int = Field(default=600, ge=10, description="CPU-time cap of that child")
    analysis_wall_s: float = Field(default=300, gt=0, description="Wall-clock cap of that child")
    result_check: Literal["verify", "none"] = Field(
        default="verify",
        description="verify: a worker's tuned program must answer as the upload does before it "
        "is stored (a child runs both); none: stored unchecked, only where every worker is as "
        "trusted as the service itself",
    )
    analysis_sandbox: Literal["auto", "bwrap", "none"] = Field(
        default="auto",
        description="bubblewrap around that child: auto (where it runs), bwrap (required), none",
    )
    warm_checkers: int = Field(
        default=1,
        ge=0,
        description="Checking children started ahead, sandboxed and with torch imported, so an "
        "upload's check does not wait for one to start (each checks once, then exits); 0: each "
        "check starts its own",
    )
    analysis_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Checks (of uploads and results) running at once; default: half the cores "
        "this process may use, at least 1. Lowered where that many caps of "
        "FXTUNE_ANALYSIS_MEMORY_MB would not fit in FXTUNE_ANALYSIS_TOTAL_MEMORY_MB",
    )
    analysis_queue: int | None = Field(
        default=None,
        ge=0,
        description="Upload checks that may wait for a running one to end; an upload past it "
        "gets 503 with Retry-After, and nothing is stored. Default: twice the concurrency",
    )
    analysis_queue_wait_s: float = Field(
        default=60,
        gt=0,
        description="Longest an upload's check waits in that queue before its 503",
    )
    analysis_total_memory_mb: int | None = Field(
        default=None,
        ge=512,
        description="Bound on the address-space caps of the checks running at once "
        "(concurrency x FXTUNE_ANALYSIS_MEMORY_MB); default: half the physical memory, and at "
        "least one check's cap",
    )
    session_hours: float = Field(
        default=12,
        gt=0,
        description="How long a dashboard sign-in (its session cookie) stays valid",
    )
    quota_active_jobs: int = Field(
        default=20,
        ge=0,
        description="Queued and running jobs per token (0: no limit); past it 429",
    )
    quota_stored_mb: float = Field(
        default=10240,
        ge=0,
        description="Bytes of uploads stored per token, in MiB (0: no limit); past it 429",
    )
    quota_uploads_per_minute: int = Field(
        default=30,
        ge=0,
        description="Uploads per token in any 60 s, counted per service process (0: no "
        "limit); past it 429 with Retry-After",
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [h.strip().lower() for h in value.split(",") if h.strip()]
        return value

    @model_validator(mode="after")
    def _one_check_fits(self) -> Settings:
        total = self.analysis_total_memory_mb
        if total is not None and total < self.analysis_memory_mb:
            raise ValueError(
                f"FXTUNE_ANALYSIS_TOTAL_MEMORY_MB ({total}) is less than one check's cap, "
                f"FXTUNE_ANALYSIS_MEMORY_MB ({self.analysis_memory_mb}): no check could run"
            )
        return self

    @property
    def resolved_database_url(self) -> str:
        """The configured URL, or SQLite under the data dir; `postgresql://` means psycopg 3."""
        url = self.database_url or f"sqlite:///{self.data_dir / 'fxtune.db'}"
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix) :]
        return url

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def token(self) -> str | None:
        return self.api_token.get_secret_value() if self.api_token else None

    @property
    def worker_secret(self) -> str | None:
        return self.worker_token.get_secret_value() if self.worker_token else None


@lru_cache
def get_settings() -> Settings:
    return Settings()
