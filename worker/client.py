"""The worker's side of the HTTP protocol (claim, heartbeat, complete, fail, download)."""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

API = "/api/v1"


class LeaseLost(Exception):
    """The service gave this job to a newer attempt (409); stop and drop the work."""


class ServiceError(Exception):
    """The service answered with an error we cannot act on; `status` is its HTTP status (None
    when the answer itself was wrong)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def servers_fault(self) -> bool:
        """A 5xx: the service failed (a bug in its checks, a database down), not the request."""
        return self.status is not None and self.status >= 500


@dataclass(frozen=True)
class Assignment:
    job_id: int
    model_id: int
    device: str
    budget_s: float | None
    lease_token: str
    lease_s: float
    sha256: str
    size_bytes: int
    name: str
    artifact_url: str
    sizes: dict[str, list[int]] | None = None  # sizes to tune dynamic dims at (None: default)
    world_size: int = 1
    ranks: tuple[RankFile, ...] = ()  # a distributed job's program per rank, rank 0 first
    mode: str = "infer"  # "train": tune a training step
    optimizer: str | None = None  # with mode "train": the optimizer stepped each step


@dataclass(frozen=True)
class RankFile:
    """One rank's uploaded program: where to download it and the digest it must have."""

    model_id: int
    sha256: str
    artifact_url: str


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code == 409:
        raise LeaseLost(_detail(resp))
    if resp.is_error:
        raise ServiceError(
            f"{resp.request.method} {resp.request.url.path}: {resp.status_code} {_detail(resp)}",
            resp.status_code,
        )


def _detail(resp: httpx.Response) -> str:
    with contextlib.suppress(ValueError, AttributeError):
        return str(resp.json()["detail"])
    return resp.text[:500]


class ServiceClient:
    """`token` is the worker token (FXTUNE_WORKER_TOKEN): the service's worker routes take it."""

    def __init__(self, server: str, token: str | None, timeout_s: float = 60) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def claim(
        self, worker_id: str, device: str, hardware: dict[str, Any], ranks: int = 1
    ) -> Assignment | None:
        claim: dict[str, Any] = {"worker_id": worker_id, "device": device, "hardware": hardware}
        if ranks > 1:  # sent only when it matters, so older services still accept the claim
            claim["ranks"] = ranks
        resp = self.http.post(f"{API}/jobs/claim", json=claim)
        if resp.status_code == 204:
            return None
        _raise_for(resp)
        body = resp.json()
        job, model = body["job"], body["model"]
        return Assignment(
            job_id=job["id"],
            model_id=job["model_id"],
            device=job["device"],
            budget_s=job["budget_s"],
            sizes=job.get("sizes"),
            lease_token=body["lease_token"],
            lease_s=body["lease_s"],
            sha256=model["sha256"],
            size_bytes=model["size_bytes"],
            name=model["name"],
            artifact_url=body["artifact_url"],
            world_size=job.get("world_size", 1),
            mode=job.get("mode", "infer"),
            optimizer=job.get("optimizer"),
            ranks=tuple(
                RankFile(r["model"]["id"], r["model"]["sha256"], r["artifact_url"])
                for r in body.get("ranks", [])
            ),
        )

    def download(self, job: Assignment, dest: Path) -> Path:
        """Stream the uploaded program to `dest`, checking it is the bytes the job names."""
        file = RankFile(job.model_id, job.sha256, job.artifact_url)
        return self.download_file(file, dest, job.lease_token)

    def download_file(self, job: RankFile, dest: Path, lease_token: str) -> Path:
        """A job's program, authorised by the job's lease alone (`X-Fxtune-Lease`)."""
        digest = hashlib.sha256()
        headers = {"X-Fxtune-Lease": lease_token}
        with (
            self.http.stream("GET", job.artifact_url, headers=headers) as resp,
            dest.open("wb") as out,
        ):
            if resp.is_error:
                resp.read()
                _raise_for(resp)
            for chunk in resp.iter_bytes(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != job.sha256:
            raise ServiceError(f"downloaded model {job.model_id} does not match its sha256")
        return dest

    def heartbeat(self, job: Assignment, progress: float, message: str) -> None:
        resp = self.http.post(
            f"{API}/jobs/{job.job_id}/heartbeat",
            json={
                "lease_token": job.lease_token,
                "progress": min(1.0, max(0.0, progress)),
                "message": message[:2000],
            },
        )
        _raise_for(resp)

    def fail(
        self, job: Assignment, error: str, retryable: bool, run_s: float | None = None
    ) -> dict[str, Any]:
        body = {"lease_token": job.lease_token, "error": error[:20000], "retryable": retryable}
        resp = self.http.post(
            f"{API}/jobs/{job.job_id}/fail",
            json={**body, **({"run_s": round(run_s, 3)} if run_s is not None else {})},
        )
        _raise_for(resp)
        return resp.json()

    def complete(
        self, job: Assignment, files: dict[str, Path], run_s: float | None = None
    ) -> dict[str, Any]:
        """Upload the results (and the run's wall time); each file is streamed from disk."""
        with contextlib.ExitStack() as stack:
            parts = {
                name: (path.name, stack.enter_context(path.open("rb")), "application/octet-stream")
                for name, path in files.items()
            }
            resp = self.http.post(
                f"{API}/jobs/{job.job_id}/complete",
                data={
                    "lease_token": job.lease_token,
                    **({"run_s": f"{run_s:.3f}"} if run_s is not None else {}),
                },
                files=parts,
                timeout=600,
            )
        _raise_for(resp)
        return resp.json()
