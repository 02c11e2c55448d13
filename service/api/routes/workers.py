"""The worker protocol: claim a job under a lease, download its program, heartbeat, then
complete or fail it.

Only the claim takes the worker token (FXTUNE_WORKER_TOKEN), never the user's. The claim hands
back a lease token, and that token alone authorises everything about that one job: downloading
its program(s) (header `X-Fxtune-Lease`), heartbeats, failure and completion (field
`lease_token`). It opens nothing else: not another job, not another model's upload. Once the
lease has passed to a newer attempt (or the job has finished) the old token gets 409 and
changes nothing. A result is checked before it is stored: its config names the job's model
(fingerprint), device kind and mode, and the tuned program, in a sandboxed child, loads through
the safe loader and answers as the original upload does on fresh inputs (`service.analysis`).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response, status
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from service.analysis import ProgramAnalysis, UnloadableProgram
from service.api.config_cache import ConfigCache
from service.api.deps import (
    AnalysisDep,
    ArtifactsDep,
    ConfigCacheDep,
    SettingsDep,
    StoreDep,
    WorkerAuth,
)
from service.api.errors import errors
from service.api.multipart import StreamedForm, missing_field, read_form
from service.api.schemas import (
    MAX_WORLD_SIZE,
    ClaimIn,
    ClaimOut,
    FailIn,
    HeartbeatIn,
    IdPath,
    JobOut,
    ModelRef,
    RankProgram,
)
from service.artifacts import ArtifactStore, Spool
from service.distributed import program_field, rank_results
from service.reports import ReportError, load_json_report, load_report, tuning_result
from service.store import AbstractStore, Job, Model, NotFound, StaleLease, TuningResult
from tuner.contract.aoti_manifest import Expected, PackageRefused, check_package

router = APIRouter(tags=["workers"])
log = logging.getLogger("fxtune.service")
LEASE_HEADER = "X-Fxtune-Lease"

MB = 1024 * 1024
# `runtime`: the OpenVINO IR zip or ONNX file of a config whose backend is a runtime.
RESULT_FILES = frozenset({"report", "program", "aoti", "runtime", "trace_baseline", "trace_tuned"})
RUNTIME_KINDS = ("openvino", "onnxruntime")

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
                        "run_s": {"type": "number", "minimum": 0, "description": "wall time"},
                        **{f: {"type": "string", "format": "binary"} for f in RESULT_FILES},
                    },
                }
            }
        },
    }
}


@router.post(
    "/jobs/claim",
    dependencies=[WorkerAuth],
    response_model=ClaimOut,
    responses={
        204: {"description": "No job is ready for this device"},
        **errors(400, 401, 404, 422),
    },
)
def claim(body: ClaimIn, store: StoreDep) -> ClaimOut | Response:
    """Lease the oldest ready job for the worker's device and ranks; 204 when there is none."""
    got = store.claim_job(body.device, body.worker_id, body.hardware, ranks=body.ranks)
    if got is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    model = store.get_model(got.job.model_id)
    program = f"/api/v1/jobs/{got.job.id}/program"
    ranks = [
        RankProgram(
            rank=rank,
            model=ModelRef.model_validate(store.get_model(i), from_attributes=True),
            artifact_url=f"{program}?rank={rank}",
        )
        for rank, i in enumerate(got.job.rank_models or [])
    ]
    return ClaimOut(
        job=JobOut.of(got.job),
        lease_token=got.lease_token,
        lease_s=got.lease_s,
        model=ModelRef.model_validate(model, from_attributes=True),
        artifact_url=program,
        ranks=ranks,
    )


@router.get(
    "/jobs/{job_id}/program",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": {}}}, **errors(401, 404, 409, 422)},
)
def download_program(
    job_id: IdPath,
    store: StoreDep,
    artifacts: ArtifactsDep,
    lease: Annotated[str | None, Header(alias=LEASE_HEADER)] = None,
    rank: Annotated[int, Query(ge=0, lt=MAX_WORLD_SIZE)] = 0,
) -> FileResponse:
    """The job's uploaded program (rank `rank` of a distributed job), for its lease holder."""
    if not lease:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, f"the {LEASE_HEADER} header is required")
    job = store.check_lease(job_id, lease)
    models = job.rank_models or [job.model_id]
    if rank >= len(models):
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has no rank {rank}")
    model = store.get_model(models[rank])
    return FileResponse(
        artifacts.path(model.sha256),
        media_type="application/octet-stream",
        filename=f"{model.name}.pt2",
    )


LEASED = errors(400, 401, 404, 409, 422)


@router.post("/jobs/{job_id}/heartbeat", response_model=JobOut, responses=LEASED)
def heartbeat(job_id: IdPath, body: HeartbeatIn, store: StoreDep) -> JobOut:
    """Extend the lease and record progress."""
    return JobOut.of(store.heartbeat(job_id, body.lease_token, body.progress, body.message))


@router.post("/jobs/{job_id}/fail", response_model=JobOut, responses=LEASED)
def fail(job_id: IdPath, body: FailIn, store: StoreDep) -> JobOut:
    """Report a failed attempt; retryable ones are requeued with backoff until attempts run out."""
    return JobOut.of(
        store.fail_job(job_id, body.lease_token, body.error, body.retryable, run_s=body.run_s)
    )


@router.post(
    "/jobs/{job_id}/complete",
    response_model=JobOut,
    openapi_extra=COMPLETE_BODY,
    responses=errors(400, 401, 404, 409, 413, 415, 422, 500, 503),
)
async def complete(
    job_id: IdPath,
    request: Request,
    store: StoreDep,
    artifacts: ArtifactsDep,
    settings: SettingsDep,
    cache: ConfigCacheDep,
    analysis: AnalysisDep,
) -> JobOut:
    """Upload report.json, the tuned program and optional AOTI package and traces.

    A distributed job (world_size N): its report, `program` (rank 0) and `program_rank1` ..
    `program_rank{N-1}`; each rank's program becomes the tuned program of that rank's model."""
    cap = int(settings.max_result_mb * MB)
    # A distributed job uploads one tuned program per rank: more fields, a larger body.
    # An unknown job is reported after the form is read, as for any job (the lease check).
    world = min(await run_in_threadpool(_world_size, store, job_id), MAX_WORLD_SIZE)
    rank_programs = {program_field(r) for r in range(1, world)}
    form = await read_form(
        request,
        artifacts,
        file_fields=RESULT_FILES | rank_programs,
        max_file_bytes=cap,
        max_body_bytes=cap * world + MB,
    )
    try:
        verify = settings.result_check == "verify"
        return await _complete(job_id, form, store, artifacts, cache, analysis, verify)
    finally:
        form.discard()


def _world_size(store: AbstractStore, job_id: int) -> int:
    try:
        return store.get_job(job_id).world_size
    except NotFound:
        return 1


def _run_s(form: StreamedForm) -> float | None:
    """The run's wall time a worker reports with its result (optional)."""
    given = form.fields.get("run_s")
    if given is None:
        return None
    try:
        run_s = float(given)
    except ValueError:
        raise _unprocessable("run_s must be a number of seconds") from None
    if not 0 <= run_s <= 1e7:
        raise _unprocessable("run_s must be between 0 and 1e7 seconds")
    return run_s


def _unprocessable(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)


async def _complete(
    job_id: int,
    form: StreamedForm,
    store: AbstractStore,
    artifacts: ArtifactStore,
    cache: ConfigCache,
    analysis: ProgramAnalysis,
    verify: bool,
) -> JobOut:
    """`verify` False (FXTUNE_RESULT_CHECK=none): the result's programs are stored unchecked."""
    token = form.fields.get("lease_token")
    if not token:
        raise missing_field("lease_token")
    leased = await run_in_threadpool(store.check_lease, job_id, token)
    if leased.world_size > 1:
        return await _complete_distributed(
            job_id, token, leased, form, store, artifacts, cache, analysis if verify else None
        )
    for name in ("report", "program"):
        if name not in form.files:
            raise missing_field(name)
    try:
        report = load_report(form.files["report"].path.read_bytes())
    except ReportError as exc:
        raise _unprocessable(str(exc)) from None
    try:
        result = tuning_result(report, {name: s.sha256 for name, s in form.files.items()})
    except ReportError as exc:
        raise _unprocessable(str(exc)) from None
    model = await _check_result_fits_job(result, leased, store, artifacts, analysis)
    aoti = form.files.get("aoti")
    if aoti is not None:  # never loaded here: its structure, manifest and job only
        expected = Expected(result.fingerprint, leased.device)
        try:
            await run_in_threadpool(check_package, aoti.path, expected)
        except PackageRefused as exc:
            raise _unprocessable(f"the AOTInductor package is refused: {exc}") from None
    unstored = await _check_runtime_artifact(form, result.config, analysis, job_id, verify)
    if verify:  # the tuned program must answer as the upload does
        original = artifacts.path(model.sha256)
        if not original.is_file():
            raise HTTPException(
                status.HTTP_409_CONFLICT, f"model {model.id}'s upload is missing from the store"
            )
        try:
            await run_in_threadpool(
                analysis.verify,
                original,
                form.files["program"].path,
                result.config,
                f"the tuned program of job {job_id}",
            )
        except UnloadableProgram as exc:
            raise _unprocessable(str(exc)) from None
    added = _store_all(artifacts, [f for n, f in form.files.items() if n not in unstored])
    try:
        job, _ = await run_in_threadpool(
            store.complete_job, job_id, token, result, None, None, _run_s(form)
        )
    except StaleLease:
        for sha in added:
            artifacts.remove(sha)
        raise
    cache.invalidate(
        ("fp", result.fingerprint, job.device, result.mode),
        ("model", job.model_id, job.device, result.mode),
    )
    return JobOut.of(job)


async def _check_runtime_artifact(
    form: StreamedForm,
    config: dict[str, Any],
    analysis: ProgramAnalysis,
    job_id: int,
    verify: bool,
) -> set[str]:
    """A runtime artifact is stored only as the one its config names (`runtime.sha256`, for
    the runtime the config chose) and, with results checked, only once the check child found
    it data alone (`tuner.checks.runtime_artifact`: no external data, custom operators or
    extensions); one refused fails the result (422). Returns the fields not to store: the
    artifact where this service could not check it (deployments then run the fallback)."""
    named = config.get("runtime") if isinstance(config.get("runtime"), dict) else None
    upload = form.files.get("runtime")
    digest = named.get("sha256") if named else None
    if upload is None:
        if digest:
            raise _unprocessable(f"the config names runtime artifact {digest:.12} but none came")
        return set()
    kind = named.get("runtime") if named else None
    if kind not in RUNTIME_KINDS or config.get("backend") != kind or digest != upload.sha256:
        raise _unprocessable("the uploaded runtime artifact is not the one its config names")
    if not verify:
        return set()
    try:
        why = await run_in_threadpool(
            analysis.check_runtime, upload.path, kind, f"the {kind} artifact of job {job_id}"
        )
    except UnloadableProgram as exc:
        raise _unprocessable(str(exc)) from None
    if why is None:
        return set()
    log.warning("job %d: the %s artifact is not stored: %s", job_id, kind, why)
    return {"runtime"}


async def _check_result_fits_job(
    result: TuningResult,
    job: Job,
    store: AbstractStore,
    artifacts: ArtifactStore,
    analysis: ProgramAnalysis,
) -> Model:
    """A config for another model, measured on another kind of device, or tuned for another
    mode or optimizer than the job asked for, is refused."""
    model = await run_in_threadpool(store.get_model, job.model_id)
    expected = model.fingerprint
    if expected is None:  # stored before uploads were fingerprinted: do it once now
        try:
            expected = await run_in_threadpool(
                analysis.fingerprint, artifacts.path(model.sha256), f"model {model.id}", True
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
    if (result.mode, result.optimizer) != (job.mode, job.optimizer):
        raise _unprocessable(
            f"the report tuned mode {result.mode!r} (optimizer {result.optimizer}), but job "
            f"{job.id} asked for mode {job.mode!r} (optimizer {job.optimizer})"
        )
    return model


async def _complete_distributed(
    job_id: int,
    token: str,
    job: Job,
    form: StreamedForm,
    store: AbstractStore,
    artifacts: ArtifactStore,
    cache: ConfigCache,
    analysis: ProgramAnalysis | None,
) -> JobOut:
    """The distributed report and one tuned program per rank; each rank model gets a config."""
    if "report" not in form.files:
        raise missing_field("report")
    models = [await run_in_threadpool(store.get_model, i) for i in job.rank_models or []]
    fields = {program_field(rank) for rank in range(len(models))}
    extra = sorted(set(form.files) - fields - {"report"})
    if extra:
        raise _unprocessable(f"unexpected files for a {job.world_size}-rank job: {extra}")
    try:
        report = load_json_report(form.files["report"].path.read_bytes())
        results = rank_results(report, job, models, {n: s.sha256 for n, s in form.files.items()})
        for field in sorted(fields) if analysis is not None else ():
            await run_in_threadpool(analysis.check_loadable, form.files[field].path, field)
    except (ReportError, UnloadableProgram) as exc:
        raise _unprocessable(str(exc)) from None
    kind = str(results[0].hardware.get("device", "")).split(":", 1)[0]
    if kind != job.device:
        raise _unprocessable(
            f"the report was measured on {kind!r}, job {job.id} is for {job.device!r}"
        )
    added = _store_all(artifacts, list(form.files.values()))
    others = {m.id: r for m, r in zip(models[1:], results[1:], strict=True)}
    try:
        done, _ = await run_in_threadpool(
            store.complete_job, job_id, token, results[0], None, others, _run_s(form)
        )
    except StaleLease:
        for sha in added:
            artifacts.remove(sha)
        raise
    for model, result in zip(models, results, strict=True):
        cache.invalidate(
            ("fp", result.fingerprint, job.device, result.mode),
            ("model", model.id, job.device, result.mode),
        )
    return JobOut.of(done)


def _store_all(artifacts: ArtifactStore, spools: list[Spool]) -> list[str]:
    """Move the spools into the store; returns the digests that were new (to undo on conflict)."""
    return [s.sha256 for s in spools if artifacts.put(s)]
