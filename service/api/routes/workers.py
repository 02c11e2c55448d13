"""The worker protocol: claim a job under a lease, heartbeat, then complete or fail it.

Every report carries the lease token from the claim; once the lease has passed to a newer attempt
(or the job has finished) the old token gets 409 and changes nothing. These routes take the
worker token (FXTUNE_WORKER_TOKEN), never the user's; and a result is checked before it is
stored: its program loads through the safe loader, its config names the job's model (fingerprint)
and was measured on the job's kind of device.
"""

from __future__ import annotations

import zipfile

from fastapi import APIRouter, HTTPException, Request, Response, status
from starlette.concurrency import run_in_threadpool

from service.api.config_cache import ConfigCache
from service.api.deps import ArtifactsDep, ConfigCacheDep, SettingsDep, StoreDep, WorkerAuth
from service.api.errors import errors
from service.api.multipart import StreamedForm, missing_field, read_form
from service.api.schemas import ClaimIn, ClaimOut, FailIn, HeartbeatIn, IdPath, JobOut, ModelRef
from service.artifacts import ArtifactStore, Spool
from service.programs import UnloadableProgram, check_loadable, fingerprint_of
from service.reports import ReportError, load_report, tuning_result
from service.store import AbstractStore, Job, StaleLease, TuningResult

router = APIRouter(tags=["workers"], dependencies=[WorkerAuth])

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
    responses={
        204: {"description": "No job is ready for this device"},
        **errors(400, 401, 404, 422),
    },
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


LEASED = errors(400, 401, 404, 409, 422)


@router.post("/jobs/{job_id}/heartbeat", response_model=JobOut, responses=LEASED)
def heartbeat(job_id: IdPath, body: HeartbeatIn, store: StoreDep) -> JobOut:
    """Extend the lease and record progress."""
    return JobOut.of(store.heartbeat(job_id, body.lease_token, body.progress, body.message))


@router.post("/jobs/{job_id}/fail", response_model=JobOut, responses=LEASED)
def fail(job_id: IdPath, body: FailIn, store: StoreDep) -> JobOut:
    """Report a failed attempt; retryable ones are requeued with backoff until attempts run out."""
    return JobOut.of(store.fail_job(job_id, body.lease_token, body.error, body.retryable))


@router.post(
    "/jobs/{job_id}/complete",
    response_model=JobOut,
    openapi_extra=COMPLETE_BODY,
    responses=errors(400, 401, 404, 409, 413, 415, 422),
)
async def complete(
    job_id: IdPath,
    request: Request,
    store: StoreDep,
    artifacts: ArtifactsDep,
    settings: SettingsDep,
    cache: ConfigCacheDep,
) -> JobOut:
    """Upload report.json, the tuned program and optional AOTI package and traces."""
    cap = int(settings.max_result_mb * MB)
    form = await read_form(
        request, artifacts, file_fields=RESULT_FILES, max_file_bytes=cap, max_body_bytes=cap + MB
    )
    try:
        return await _complete(job_id, form, store, artifacts, cache)
    finally:
        form.discard()


def _unprocessable(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)


async def _complete(
    job_id: int,
    form: StreamedForm,
    store: AbstractStore,
    artifacts: ArtifactStore,
    cache: ConfigCache,
) -> JobOut:
    token = form.fields.get("lease_token")
    if not token:
        raise missing_field("lease_token")
    leased = await run_in_threadpool(store.check_lease, job_id, token)
    for name in ("report", "program"):
        if name not in form.files:
            raise missing_field(name)
    try:
        report = load_report(form.files["report"].path.read_bytes())
        await run_in_threadpool(check_loadable, form.files["program"].path)
    except (ReportError, UnloadableProgram) as exc:
        raise _unprocessable(str(exc)) from None
    aoti = form.files.get("aoti")
    if aoti is not None and not zipfile.is_zipfile(aoti.path):
        raise _unprocessable("aoti is not a zip package")
    try:
        result = tuning_result(report, {name: s.sha256 for name, s in form.files.items()})
    except ReportError as exc:
        raise _unprocessable(str(exc)) from None
    await _check_result_fits_job(result, leased, store, artifacts)
    added = _store_all(artifacts, list(form.files.values()))
    try:
        job, _ = await run_in_threadpool(store.complete_job, job_id, token, result)
    except StaleLease:
        for sha in added:
            artifacts.remove(sha)
        raise
    cache.invalidate(("fp", result.fingerprint, job.device), ("model", job.model_id, job.device))
    return JobOut.of(job)


async def _check_result_fits_job(
    result: TuningResult, job: Job, store: AbstractStore, artifacts: ArtifactStore
) -> None:
    """A config for another model, or measured on another kind of device, is refused."""
    model = await run_in_threadpool(store.get_model, job.model_id)
    expected = model.fingerprint
    if expected is None:  # stored before uploads were fingerprinted: do it once now
        try:
            expected = await run_in_threadpool(
                fingerprint_of, artifacts.path(model.sha256), f"model {model.id}"
            )
        except UnloadableProgram as exc:
            raise _unprocessable(str(exc)) from None
        await run_in_threadpool(store.set_fingerprint, model.id, expected)
    if result.fingerprint != expected:
        raise _unprocessable(
            f"the report's model_fingerprint {result.fingerprint} is not that of model "
            f"{model.id} ({expected}): this result belongs to another model"
        )
    kind = str(result.hardware.get("device", "")).split(":", 1)[0]
    if kind != job.device:
        raise _unprocessable(
            f"the report was measured on {kind or 'no device'!r}, but job {job.id} is for "
            f"{job.device!r}"
        )


def _store_all(artifacts: ArtifactStore, spools: list[Spool]) -> list[str]:
    """Move the spools into the store; returns the digests that were new (to undo on conflict)."""
    return [s.sha256 for s in spools if artifacts.put(s)]
