"""Uploading models, asking for tuning, and getting the tuned config, program and report back."""

from __future__ import annotations

import json
import logging
import re
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from service.analysis import AnalysisFailed, UnloadableProgram
from service.api.deps import (
    AnalysisDep,
    ArtifactsDep,
    ConfigCacheDep,
    QuotasDep,
    Reader,
    SettingsDep,
    StoreDep,
    Writer,
    WriterIdentity,
)
from service.api.errors import errors
from service.api.multipart import missing_field, read_form
from service.api.responses import not_found, serve_config
from service.api.schemas import (
    Device,
    IdPath,
    JobCreate,
    JobOut,
    Limit,
    ModelOut,
    ModeQuery,
    Offset,
    UploadOptions,
)
from service.artifacts import ArtifactStore, Spool
from service.check_gate import ChecksBusy
from service.distributed import RankModelsError, check_rank_models
from service.runtime_artifacts import runtime_file
from service.store import AbstractStore, ConfigSummary, Model, OverQuota, StoredConfig
from tuner.contract.config import Mode
from tuner.contract.device import KINDS
from tuner.contract.errors import ArtifactFormatError, UnsafeArtifactError
from tuner.contract.training import OPTIMIZER_NAMES
from tuner.loading.load import check_archive

router = APIRouter(tags=["models"])
log = logging.getLogger("fxtune.service")

MB = 1024 * 1024
MAX_NAME = 255
DeviceQuery = Annotated[Device, Query(description="Target device the config was tuned for")]
HardwareQuery = Annotated[
    str | None, Query(description="Exact hardware key; the newest config wins when omitted")
]

UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file"],
                    "properties": {
                        "file": {"type": "string", "format": "binary"},
                        "name": {"type": "string"},
                        "tune": {"type": "boolean", "default": False},
                        "device": {"type": "string", "enum": list(KINDS)},
                        "budget_s": {"type": "number"},
                        "mode": {"type": "string", "enum": list(get_args(Mode))},
                        "optimizer": {"type": "string", "enum": list(OPTIMIZER_NAMES)},
                    },
                }
            }
        },
    }
}


def display_name(given: str | None, filename: str | None, sha256: str) -> str:
    """The `name` field, else the file's stem without any path (client paths are not ours)."""
    if given is None:
        given = Path(re.split(r"[\\/]", filename or "")[-1]).stem
    name = "".join(ch for ch in given if ch.isprintable()).strip()[:MAX_NAME].strip()
    return name or sha256[:12]


def _options(request: Request, fields: dict[str, str]) -> UploadOptions:
    raw: dict[str, Any] = {**request.query_params, **fields}
    raw.pop("file", None)
    try:
        return UploadOptions.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        for e in errors:
            e["loc"] = ("body", *e["loc"])
        raise RequestValidationError(errors) from None


@router.post(
    "/models",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelOut,
    dependencies=[Writer],
    openapi_extra=UPLOAD_BODY,
    responses={
        200: {"description": "These bytes were uploaded before", "model": ModelOut},
        **errors(400, 401, 413, 415, 422, 429, 500, 503),
    },
)
async def upload_model(
    request: Request,
    response: Response,
    caller: WriterIdentity,
    store: StoreDep,
    artifacts: ArtifactsDep,
    settings: SettingsDep,
    analysis: AnalysisDep,
    quotas: QuotasDep,
) -> ModelOut:
    """Upload a `.pt2` (multipart field `file`); `tune=true` queues a job at once.

    Counts against the caller's quotas (429 with Retry-After); its check waits for a free slot
    or gets 503 with Retry-After (nothing stored either way)."""
    usage = await run_in_threadpool(store.owner_usage, caller)
    quotas.admit_upload(caller, usage)  # before a byte of the body is read
    cap = int(settings.max_upload_mb * MB)
    form = await read_form(
        request,
        artifacts,
        file_fields=frozenset({"file"}),
        max_file_bytes=cap,
        max_body_bytes=cap + MB,
    )
    try:
        spool = form.files.get("file")
        if spool is None:
            raise missing_field("file")
        options = _options(request, form.fields)
        try:
            await run_in_threadpool(check_archive, spool.path)
        except ArtifactFormatError as exc:
            raise _unsupported(str(exc)) from None
        except UnsafeArtifactError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
        except Exception as exc:  # fxtune's bug, not a verdict on the file: a 500, not a 4xx
            log.exception("checking an upload's archive failed with an internal error")
            raise AnalysisFailed(
                "checking the uploaded archive failed with an internal error; nothing was stored"
            ) from exc
        known = await run_in_threadpool(store.model_with_sha256, spool.sha256)
        # Known bytes cost no check; their job may be one that is reused (the store decides).
        new_bytes = 0 if known else spool.size
        quotas.before_check(usage, new_bytes, options.tune and known is None)
        if known is not None and known.fingerprint is not None:
            fingerprint = known.fingerprint  # the same bytes again: checked when first uploaded
        else:
            try:
                fingerprint = await run_in_threadpool(analysis.fingerprint, spool.path)
            except UnloadableProgram as exc:
                raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
            except ChecksBusy:  # the service's limit, not the caller's: this one is not counted
                quotas.uploads.forget(caller)
                raise
        name = display_name(options.name, spool.filename, spool.sha256)
        model, created = await _store_upload(
            store, artifacts, spool, name, fingerprint, caller, quotas.limits.stored_bytes
        )
    finally:
        form.discard()
    job = None
    if options.tune:
        try:
            job, _ = await run_in_threadpool(
                partial(
                    store.enqueue_job,
                    model.id,
                    options.device,
                    options.budget_s,
                    mode=options.mode,
                    optimizer=options.optimizer,
                    owner=caller,
                    max_owner_active=quotas.limits.active_jobs,
                )
            )
        except OverQuota as exc:  # jobs ended or began since the pre-check: say what stands
            detail = f"model {model.id} is stored, but no job was queued: {exc}"
            raise OverQuota(detail, exc.kind) from None
    configs = await run_in_threadpool(store.list_configs, [model.id])
    response.status_code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
    return ModelOut.of(model, configs, job)


async def _store_upload(
    store: AbstractStore,
    artifacts: ArtifactStore,
    spool: Spool,
    name: str,
    fingerprint: str,
    caller: str,
    max_bytes: int | None,
) -> tuple[Model, bool]:
    """The bytes into the artifact store, then the row, charged to the caller's quota in its
    transaction; a refusal there takes back the bytes this request added (unless another
    upload stored them as a model meanwhile)."""
    added = artifacts.put(spool)
    try:
        return await run_in_threadpool(
            partial(
                store.add_model,
                spool.sha256,
                name,
                spool.size,
                fingerprint,
                owner=caller,
                max_owner_bytes=max_bytes,
            )
        )
    except OverQuota:
        if added and await run_in_threadpool(store.model_with_sha256, spool.sha256) is None:
            artifacts.remove(spool.sha256)
        raise


def _unsupported(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, detail)


@router.get(
    "/models", response_model=list[ModelOut], dependencies=[Reader], responses=errors(401, 422)
)
def list_models(store: StoreDep, limit: Limit = 100, offset: Offset = 0) -> list[ModelOut]:
    models = store.list_models(limit, offset)
    by_model: dict[int, list[ConfigSummary]] = {}
    for c in store.list_configs([m.id for m in models]):
        by_model.setdefault(c.model_id, []).append(c)
    return [ModelOut.of(m, by_model.get(m.id, [])) for m in models]


@router.get(
    "/models/{model_id}",
    response_model=ModelOut,
    dependencies=[Reader],
    responses=errors(401, 404, 422),
)
def get_model(model_id: IdPath, store: StoreDep) -> ModelOut:
    model = store.get_model(model_id)
    return ModelOut.of(model, store.list_configs([model_id]))


@router.get(
    "/models/{model_id}/file",
    response_class=FileResponse,
    dependencies=[Reader],
    responses={200: {"content": {"application/octet-stream": {}}}, **errors(401, 404, 422)},
)
def download_upload(model_id: IdPath, store: StoreDep, artifacts: ArtifactsDep) -> FileResponse:
    """The uploaded program as it came in, for its owner (workers download a job's program
    with its lease: `GET /jobs/{id}/program`)."""
    model = store.get_model(model_id)
    return _file(artifacts.path(model.sha256), f"{model.name}.pt2", model.sha256)


@router.post(
    "/models/{model_id}/jobs",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=JobOut,
    responses=errors(400, 401, 404, 422, 429),
)
def create_job(
    model_id: IdPath, body: JobCreate, caller: WriterIdentity, store: StoreDep, quotas: QuotasDep
) -> JobOut:
    """Queue tuning for a device; an unfinished job for the same device (and mode, ranks and
    optimizer) is returned instead. `mode` "train" tunes a training step.

    `world_size` N > 1 with `rank_models` (N uploads, rank 0 first) queues a distributed job."""
    rank_models = None
    if body.world_size > 1 and body.rank_models:
        models = [store.get_model(i) for i in body.rank_models]
        try:
            check_rank_models(model_id, models)
        except RankModelsError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
        rank_models = body.rank_models
    job, _ = store.enqueue_job(
        model_id,
        body.device,
        body.budget_s,
        body.sizes,
        body.world_size,
        rank_models,
        mode=body.mode,
        optimizer=body.optimizer,
        owner=caller,
        max_owner_active=quotas.limits.active_jobs,
    )
    return JobOut.of(job)


@router.get(
    "/models/{model_id}/config",
    dependencies=[Reader],
    responses={
        200: {"description": "The tuned config (JSON), with an ETag"},
        304: {"description": "Unchanged since the ETag in If-None-Match"},
        **errors(401, 404, 422),
    },
)
async def get_config(
    model_id: IdPath,
    request: Request,
    store: StoreDep,
    cache: ConfigCacheDep,
    device: DeviceQuery = "cpu",
    hardware: HardwareQuery = None,
    mode: ModeQuery = "infer",
) -> Response:
    """The tuned config; send If-None-Match with the last ETag to get a cheap 304."""
    return await serve_config(
        request,
        cache,
        ("model", model_id, device, mode),
        hardware,
        lambda: _tuned(store, model_id, device, hardware, mode=mode),
    )


def _tuned(
    store: StoreDep,
    model_id: int,
    device: str,
    hardware: str | None,
    details: bool = False,
    mode: str = "infer",
) -> StoredConfig:
    store.get_model(model_id)  # an unknown model is its own 404, not "no config yet"
    return store.get_config(model_id, device, hardware, details, mode)


@router.get(
    "/models/{model_id}/artifact",
    response_class=FileResponse,
    dependencies=[Reader],
    responses={200: {"content": {"application/octet-stream": {}}}, **errors(401, 404, 422)},
)
def get_artifact(
    model_id: IdPath,
    store: StoreDep,
    artifacts: ArtifactsDep,
    device: DeviceQuery = "cpu",
    format: Annotated[Literal["pt2", "aoti", "runtime"], Query()] = "pt2",
    hardware: HardwareQuery = None,
    mode: ModeQuery = "infer",
) -> FileResponse:
    """The transformed program (`.pt2`), the AOTInductor package with `format=aoti`, or the
    runtime's artifact (ONNX file, OpenVINO IR zip) with `format=runtime`."""
    tuned = _tuned(store, model_id, device, hardware, mode=mode)
    model = store.get_model(model_id)
    if format == "runtime":
        found = runtime_file(tuned.config, artifacts)
        if found is None:
            raise not_found(f"no runtime artifact for model {model_id} on {device}")
        return _file(found.path, f"{model.name}.{found.filename}", found.sha256)
    if format == "aoti":
        if tuned.aoti_sha256 is None:
            raise not_found(f"no AOTInductor package for model {model_id} on {device}")
        return _file(artifacts.path(tuned.aoti_sha256), f"{model.name}.aoti.pt2", tuned.aoti_sha256)
    return _file(
        artifacts.path(tuned.program_sha256), f"{model.name}.tuned.pt2", tuned.program_sha256
    )


@router.get("/models/{model_id}/report", dependencies=[Reader], responses=errors(401, 404, 422))
def get_report(
    model_id: IdPath,
    store: StoreDep,
    artifacts: ArtifactsDep,
    device: DeviceQuery = "cpu",
    hardware: HardwareQuery = None,
    mode: ModeQuery = "infer",
) -> JSONResponse:
    """The worker's report.json (config with per-site decisions, profiles), artifacts as URLs."""
    tuned = _tuned(store, model_id, device, hardware, details=True, mode=mode)
    path = artifacts.path(tuned.report_sha256)
    if not path.is_file():
        raise not_found(f"report {tuned.report_sha256[:12]} is missing from the store")
    report = json.loads(path.read_bytes())
    # A distributed job's report (every rank's figures) has no config: this rank's goes in.
    report.setdefault("config", tuned.config)
    base = f"/api/v1/models/{model_id}"
    query = f"device={device}&mode={mode}&hardware={quote(tuned.summary.hardware_key)}"
    report["artifacts"] = {
        "program": f"{base}/artifact?{query}",
        "aoti": f"{base}/artifact?{query}&format=aoti" if tuned.aoti_sha256 else None,
        "runtime": f"{base}/artifact?{query}&format=runtime"
        if runtime_file(tuned.config, artifacts)
        else None,
        "traces": {
            p.kind: f"{base}/trace?{query}&kind={p.kind}" for p in tuned.profiles if p.trace_sha256
        },
    }
    report["tuned"] = {
        "model_id": model_id,
        "device": device,
        "mode": mode,
        "hardware_key": tuned.summary.hardware_key,
        "job_id": tuned.summary.job_id,
        "updated_at": tuned.summary.updated_at.isoformat(),
    }
    return JSONResponse(report)


@router.get(
    "/models/{model_id}/trace",
    response_class=FileResponse,
    dependencies=[Reader],
    responses={200: {"content": {"application/json": {}}}, **errors(401, 404, 422)},
)
def get_trace(
    model_id: IdPath,
    store: StoreDep,
    artifacts: ArtifactsDep,
    kind: Annotated[Literal["baseline", "tuned"], Query()],
    device: DeviceQuery = "cpu",
    hardware: HardwareQuery = None,
    mode: ModeQuery = "infer",
) -> FileResponse:
    """A profiler trace (Chrome trace JSON; open it in Perfetto or chrome://tracing)."""
    tuned = _tuned(store, model_id, device, hardware, details=True, mode=mode)
    sha = next((p.trace_sha256 for p in tuned.profiles if p.kind == kind), None)
    if sha is None:
        raise not_found(f"no {kind} trace for model {model_id} on {device}")
    return _file(artifacts.path(sha), f"{model_id}-{device}-{mode}-{kind}.trace.json", sha, "json")


def _file(path: Path, filename: str, sha256: str, kind: str = "binary") -> FileResponse:
    if not path.is_file():
        raise not_found(f"artifact {sha256[:12]} is missing from the store")
    media = "application/json" if kind == "json" else "application/octet-stream"
    return FileResponse(path, media_type=media, filename=filename, headers={"ETag": f'"{sha256}"'})
