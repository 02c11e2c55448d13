"""Shared response helpers: conditional config responses and JSON errors."""

from __future__ import annotations

from fastapi import HTTPException, Request, Response, status
from fastapi.responses import JSONResponse

from service.store import TunedConfig


def not_found(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail)


def _matches(if_none_match: str, etag: str) -> bool:
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or etag in tags


def config_response(request: Request, tuned: TunedConfig) -> Response:
    """Deployments poll this; an unchanged config costs them a 304 and no body."""
    etag = tuned.summary.etag
    headers = {
        "ETag": etag,
        "Cache-Control": "no-cache",
        "X-Fxtune-Hardware-Key": tuned.summary.hardware_key.encode("ascii", "replace").decode(),
    }
    if _matches(request.headers.get("if-none-match", ""), etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return JSONResponse(tuned.config, headers=headers)
