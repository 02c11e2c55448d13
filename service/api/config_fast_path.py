"""Cached config fetches answered before FastAPI's routing and dependency resolution.

Deployments poll `GET /api/v1/configs/{fingerprint}` (and `/models/{id}/config`); when the
config is in the in-memory cache and the caller passes the same read rule the routes apply
(`check_reader`), the answer is sent from here. Everything else (a miss, a refusal, a malformed
request) falls through to the routes, which produce the real answer or error and fill the cache.
It sits inside `BrowserGuard`, so the Host check applies first.
"""

from __future__ import annotations

import re
from typing import get_args

from fastapi import HTTPException
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.config_cache import ConfigCache
from service.api.config_cache import Scope as CacheScope
from service.api.deps import bearer, check_reader
from service.api.responses import config_response
from service.api.schemas import INT64_MAX, Device
from tuner.contract.config import Mode

_FINGERPRINT = re.compile(r"^/api/v1/configs/([0-9a-f]{1,64})$")
_MODEL = re.compile(r"^/api/v1/models/([1-9][0-9]{0,18})/config$")
DEVICES = frozenset(get_args(Device))
MODES = frozenset(get_args(Mode))


def _cache_scope(path: str, device: str, mode: str) -> CacheScope | None:
    if device not in DEVICES or mode not in MODES:
        return None
    if m := _FINGERPRINT.match(path):
        return ("fp", m.group(1), device, mode)
    if (m := _MODEL.match(path)) and int(m.group(1)) <= INT64_MAX:
        return ("model", int(m.group(1)), device, mode)
    return None


class ConfigFastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        query = QueryParams(scope["query_string"])
        key = _cache_scope(scope["path"], query.get("device", "cpu"), query.get("mode", "infer"))
        cache: ConfigCache | None = getattr(scope["app"].state, "config_cache", None)
        entry = cache.get(key, query.get("hardware")) if key and cache else None
        if entry is not None:
            request = Request(scope)
            try:
                check_reader(request, scope["app"].state.settings, await bearer(request))
            except HTTPException:
                entry = None  # the route answers with the refusal
            if entry is not None:
                await config_response(request, entry)(scope, receive, send)
                return
        await self.app(scope, receive, send)
