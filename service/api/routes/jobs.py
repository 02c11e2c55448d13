"""Job status for people and dashboards."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query

from service.api.deps import Reader, StoreDep
from service.api.errors import errors
from service.api.schemas import IdPath, IdQuery, JobOut, Limit, Offset

router = APIRouter(tags=["jobs"])


@router.get("/jobs", response_model=list[JobOut], dependencies=[Reader], responses=errors(401, 422))
def list_jobs(
    store: StoreDep,
    status: Annotated[Literal["queued", "running", "succeeded", "failed"] | None, Query()] = None,
    model_id: IdQuery = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[JobOut]:
    """Newest first."""
    return [JobOut.of(j) for j in store.list_jobs(status, model_id, limit, offset)]


@router.get(
    "/jobs/{job_id}", response_model=JobOut, dependencies=[Reader], responses=errors(401, 404, 422)
)
def get_job(job_id: IdPath, store: StoreDep) -> JobOut:
    return JobOut.of(store.get_job(job_id))
