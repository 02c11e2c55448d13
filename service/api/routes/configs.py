"""Config lookup by model fingerprint: what a deployment holding only the model uses."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from service.api.deps import ConfigCacheDep, Reader, StoreDep
from service.api.errors import errors
from service.api.responses import serve_config
from service.api.schemas import Device, ModeQuery

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
