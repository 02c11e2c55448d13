"""Config lookup by model fingerprint: what a deployment holding only the model uses."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from service.api.deps import ArtifactsDep, ConfigCacheDep, Reader, StoreDep
from service.api.errors import errors
from service.api.responses import not_found, serve_config
from service.api.schemas import Device, ModeQuery
from service.runtime_artifacts import runtime_file

router = APIRouter(tags=["configs"])


@router.get(
    "/configs/{fingerprint}",
    dependencies=[Reader],
    responses={
        200: {"description": "The tuned config (JSON), with an ETag"},
        304: {"description": "Unchanged since the ETag in If-None-Match"},
        **errors(401, 404, 422),
    },
)
async def get_config_by_fingerprint(
    fingerprint: Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")],
    request: Request,
    store: StoreDep,
    cache: ConfigCacheDep,
    device: Annotated[Device, Query()] = "cpu",
    hardware: Annotated[str | None, Query()] = None,
    mode: ModeQuery = "infer",
) -> Response:
    """The newest tuned config for this fingerprint (`tuner.graph.fingerprint.model_fingerprint`);
    `mode=train` for the training config (`load_tuned(..., mode="train")`)."""
    return await serve_config(
        request,
        cache,
        ("fp", fingerprint, device, mode),
        hardware,
        lambda: store.get_config_by_fingerprint(fingerprint, device, hardware, mode=mode),
    )


@router.get(
    "/configs/{fingerprint}/runtime",
    response_class=FileResponse,
    dependencies=[Reader],
    responses={200: {"content": {"application/octet-stream": {}}}, **errors(401, 404, 422)},
)
async def get_runtime_artifact(
    fingerprint: Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")],
    store: StoreDep,
    artifacts: ArtifactsDep,
    sha256: Annotated[str, Query(pattern=r"^[0-9a-f]{64}$")],
    device: Annotated[Device, Query()] = "cpu",
    hardware: Annotated[str | None, Query()] = None,
    mode: ModeQuery = "infer",
) -> FileResponse:
    """The runtime artifact (ONNX file, OpenVINO IR zip) of the config for this fingerprint,
    named by the digest that config records (`runtime.sha256`): a deployment fetches exactly
    the bytes its config was measured with, or gets 404 (then it runs the config's fallback)."""
    tuned = await run_in_threadpool(
        store.get_config_by_fingerprint, fingerprint, device, hardware, False, mode
    )
    found = runtime_file(tuned.config, artifacts, sha256)
    if found is None:
        raise not_found(f"no runtime artifact {sha256[:12]} for fingerprint {fingerprint}")
    return FileResponse(
        found.path,
        media_type="application/octet-stream",
        filename=found.filename,
        headers={"ETag": f'"{sha256}"'},
    )
