"""The worker protocol: claim a job under a lease, heartbeat, then complete or fail it.

Every report carries the lease token from the claim; once the lease has passed to a newer attempt
(or the job has finished) the old token gets 409 and changes nothing.
"""

from __future__ import annotations

import zipfile

from fastapi import APIRouter, HTTPException, Request, Response, status
from starlette.concurrency import run_in_threadpool

from service.api.deps import ArtifactsDep, SettingsDep, StoreDep, Writer
from service.api.multipart import StreamedForm, missing_field, read_form
from service.api.schemas import ClaimIn, ClaimOut, FailIn, HeartbeatIn, JobOut, ModelRef
from service.artifacts import ArtifactStore, Spool
from service.reports import ReportError, load_report, tuning_result
from service.store import AbstractStore, StaleLease
from tuner.errors import ArtifactFormatError
from tuner.load import check_archive

router = APIRouter(tags=["workers"], dependencies=[Writer])

MB = 1024 * 1024
RESULT_FILES = frozenset({"report", "program", "aoti", "trace_baseline", "trace_tuned"})

COMPLETE_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["lease_token", "report", "program"],
                    "properties": {
                        "lease_token": {"type": "string"},
                        **{f: {"type": "string", "format": "binary"} for f in RESULT_FILES},
                    },
                }
            }
        },
    }
}


@router.post(
    "/jobs/claim",
    response_model=ClaimOut,
    responses={204: {"description": "No job is ready for this device"}},
)
def claim(body: ClaimIn, store: StoreDep) -> ClaimOut | Response:
    """Lease the oldest ready job for the worker's device; 204 when there is none."""
    got = store.claim_job(body.device, body.worker_id, body.hardware)
    if got is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    model = store.get_model(got.job.model_id)
    return ClaimOut(
        job=JobOut.of(got.job),
        lease_token=got.lease_token,
        lease_s=got.lease_s,
        model=ModelRef.model_validate(model, from_attributes=True),
        artifact_url=f"/api/v1/models/{model.id}/file",
    )


@router.post("/jobs/{job_id}/heartbeat", response_model=JobOut)
def heartbeat(job_id: int, body: HeartbeatIn, store: StoreDep) -> JobOut:
    """Extend the lease and record progress."""
    return JobOut.of(store.heartbeat(job_id, body.lease_token, body.progress, body.message))


@router.post("/jobs/{job_id}/fail", response_model=JobOut)
def fail(job_id: int, body: FailIn, store: StoreDep) -> JobOut:
    """Report a failed attempt; retryable ones are requeued with backoff until attempts run out."""
    return JobOut.of(store.fail_job(job_id, body.lease_token, body.error, body.retryable))


@router.post("/jobs/{job_id}/complete", response_model=JobOut, openapi_extra=COMPLETE_BODY)
async def complete(
    job_id: int,
    request: Request,
    store: StoreDep,
    artifacts: ArtifactsDep,
    settings: SettingsDep,
) -> JobOut:
    """Upload report.json, the tuned program and optional AOTI package and traces."""
    cap = int(settings.max_result_mb * MB)
    form = await read_form(
        request, artifacts, file_fields=RESULT_FILES, max_file_bytes=cap, max_body_bytes=cap + MB
    )
    try:
        return await _complete(job_id, form, store, artifacts)
    finally:
        form.discard()


async def _complete(
    job_id: int, form: StreamedForm, store: AbstractStore, artifacts: ArtifactStore
) -> JobOut:
    token = form.fields.get("lease_token")
    if not token:
        raise missing_field("lease_token")
    await run_in_threadpool(store.check_lease, job_id, token)
    for name in ("report", "program"):
        if name not in form.files:
            raise missing_field(name)
    try:
        report = load_report(form.files["report"].path.read_bytes())
        await run_in_threadpool(check_archive, form.files["program"].path)
    except (ReportError, ArtifactFormatError) as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    aoti = form.files.get("aoti")
    if aoti is not None and not zipfile.is_zipfile(aoti.path):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, "aoti is not a zip package")
    try:
        result = tuning_result(report, {name: s.sha256 for name, s in form.files.items()})
    except ReportError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    added = _store_all(artifacts, list(form.files.values()))
    try:
        job, _ = await run_in_threadpool(store.complete_job, job_id, token, result)
    except StaleLease:
        for sha in added:
            artifacts.remove(sha)
        raise
    return JobOut.of(job)


def _store_all(artifacts: ArtifactStore, spools: list[Spool]) -> list[str]:
    """Move the spools into the store; returns the digests that were new (to undo on conflict)."""
    return [s.sha256 for s in spools if artifacts.put(s)]
