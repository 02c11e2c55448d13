"""Shared response helpers: conditional config responses (from the in-memory cache)."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import HTTPException, Request, Response, status
from starlette.concurrency import run_in_threadpool

from service.api.config_cache import CachedConfig, ConfigCache, Scope
from service.store import StoredConfig


def not_found(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail)


def _matches(if_none_match: str, etag: str) -> bool:
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or etag in tags


def config_response(request: Request, entry: CachedConfig) -> Response:
    """Deployments poll this; an unchanged config costs them a 304 and no body."""
    headers = {
        "ETag": entry.etag,
        "Cache-Control": "no-cache",
        "X-Fxtune-Hardware-Key": entry.hardware_key.encode("ascii", "replace").decode(),
    }
    if _matches(request.headers.get("if-none-match", ""), entry.etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(entry.body, media_type="application/json", headers=headers)


async def serve_config(
    request: Request,
    cache: ConfigCache,
    scope: Scope,
    hardware: str | None,
    load: Callable[[], StoredConfig],
) -> Response:
    """From the cache when it holds this config; else from the store (in a thread), then cached."""
    entry = cache.get(scope, hardware)
    if entry is None:
        generation = cache.generation(scope)
        tuned = await run_in_threadpool(load)
        s = tuned.summary
        entry = cache.put(scope, hardware, generation, tuned.config, s.etag, s.hardware_key)
    return config_response(request, entry)
