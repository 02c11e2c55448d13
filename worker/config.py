"""Worker settings, from `FXTUNE_*` environment variables (CLI options override them)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from tuner.host.job_caches import DEFAULT_STORE
from tuner.host.sandbox import SandboxMode
from tuner.host.warm_folder import WARM_COMMAND


def default_tune_command() -> list[str]:
    return [sys.executable, "-m", "fxtune_cli", "tune"]


def default_warm_command() -> list[str]:
    return list(WARM_COMMAND)


class WorkerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FXTUNE_", extra="ignore")

    server: str = "http://127.0.0.1:8000"
    worker_token: SecretStr | None = Field(
        default=None,
        description="The service's FXTUNE_WORKER_TOKEN (the user token is refused on worker "
        "routes); unset only for a service without tokens, on loopback",
    )
    worker_tune_command: list[str] = Field(
        default_factory=default_tune_command,
        description="Command prefix that tunes one model (JSON list in the environment)",
    )
    worker_warm_command: list[str] = Field(
        default_factory=default_warm_command,
        description="Command prefix that builds one tiny AOTInductor package (its output path "
        "appended) in a folder copied into every job's, so a job's first build reuses the "
        "precompiled headers and compiler probes (JSON list; [] builds nothing)",
    )
    worker_timeout_s: float = Field(default=3600, gt=0, description="Wall-clock cap per job")
    worker_memory_mb: int = Field(
        default=0, ge=0, description="Address-space cap for CPU jobs; 0 = the fraction below"
    )
    worker_memory_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Address-space cap for CPU jobs as a share of physical memory",
    )
    worker_sandbox: SandboxMode = Field(
        default="auto",
        description="auto or bwrap: tuning children run under bubblewrap (only the system, the "
        "Python environment, the job folder and the decision cache visible; no network), and "
        "the worker refuses to start where it cannot run; none: resource limits only, logged "
        "loudly and shown on the dashboard",
    )
    worker_child_env: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Extra variable names passed to tuning children besides the allowlist "
        "(comma-separated); names with TOKEN, SECRET, PASSWORD or DATABASE in them never are",
    )
    worker_poll_s: float = Field(default=2.0, gt=0)
    worker_scratch_dir: Path | None = None
    worker_decision_cache: Path = Field(
        default_factory=lambda: DEFAULT_STORE,
        description="Decision cache shared by this machine's jobs: each job reads a copy, and "
        "what it measured is merged after the worker checked it (compile times beside it)",
    )
    worker_tune_threads: int | None = Field(
        default=None,
        ge=1,
        description="CPU threads per tuning job (below the core count on "
        "machines shared with other work, so measurements are not stalled by it)",
    )

    worker_ranks: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Ranks this worker can run at once (processes of a distributed job: at most "
        "its cores, or GPUs); it claims only jobs whose world_size is at most this",
    )

    @field_validator("worker_child_env", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @property
    def token(self) -> str | None:
        return self.worker_token.get_secret_value() if self.worker_token else None
