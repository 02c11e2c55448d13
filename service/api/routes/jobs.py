"""Job status for people and dashboards."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from service.api.deps import Reader, StoreDep
from service.api.schemas import JobOut

router = APIRouter(tags=["jobs"])


@router.get("/jobs", response_model=list[JobOut], dependencies=[Reader])
def list_jobs(
    store: StoreDep,
    status: Annotated[Literal["queued", "running", "succeeded", "failed"] | None, Query()] = None,
    model_id: Annotated[int | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> list[JobOut]:
    """Newest first."""
    return [JobOut.of(j) for j in store.list_jobs(status, model_id, limit, offset)]


@router.get("/jobs/{job_id}", response_model=JobOut, dependencies=[Reader])
def get_job(job_id: int, store: StoreDep) -> JobOut:
    return JobOut.of(store.get_job(job_id))
