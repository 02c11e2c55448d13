"""Request bodies: credentials checked before a byte is read, and a cap per route before parsing.

FastAPI reads and parses a JSON body before it runs a route's dependencies, so without this an
anonymous client could make the service buffer and parse any amount of JSON before being told
401 (a 200 MB body cost 600 MB and seconds), and a 422 echoed the whole input back. This pure
ASGI middleware wraps `receive`: when the routed endpoint first asks for the body, the route is
known (`scope["route"]`) and nothing of the body has been read yet, so

- the route's own auth dependencies (`Writer`, `WorkerAuth`, ...), which decide from headers
  alone, run first, and a refusal is their 401/403 without a byte of the body read;
- JSON routes take at most `FXTUNE_MAX_JSON_KB`: a larger `Content-Length` is a 413 at once, and
  a chunked body is counted as it arrives and cut off with 413 when it passes the cap;
- routes that declare a multipart body (uploads, results) stream it through
  `service.api.multipart`, which enforces the upload and result caps chunk by chunk.

A body nobody reads (a GET with one) is dropped by the server unread.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from fastapi import HTTPException, Request, status
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import bearer, require_reader, require_worker, require_writer

AuthCheck = Callable[..., Awaitable[object]]
# The auth dependencies that decide from headers alone (token, client address), so they can run
# before the body; (request, settings, credentials) is their signature.
HEADER_CHECKS: frozenset[AuthCheck] = frozenset({require_reader, require_writer, require_worker})


class BodyTooLarge(HTTPException):
    """Raised from `receive` once a counted body passes its cap; FastAPI answers it as is."""

    def __init__(self, cap: int) -> None:
        super().__init__(
            status.HTTP_413_CONTENT_TOO_LARGE,
            f"request body larger than the limit of {cap // 1024} KiB for this route",
        )


class BodyGuard:
    """Auth before the body, and a byte cap on every body that is not streamed to a spool."""

    def __init__(self, app: ASGIApp, max_json_bytes: int) -> None:
        self.app = app
        self.max_json_bytes = max_json_bytes
        self._plans: dict[int, tuple[tuple[AuthCheck, ...], bool]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared, _ = _body_headers(scope)
        cap: int | None = None  # None: not decided yet (the first read decides)
        received = 0
        started = False

        async def guarded() -> Message:
            nonlocal cap, received
            if cap is None:
                checks, streamed = self._plan(scope.get("route"))
                refusal = await _auth_refusal(scope, checks)
                if refusal is not None:
                    raise refusal
                cap = 0 if streamed else self.max_json_bytes
                if cap and declared > cap:
                    raise BodyTooLarge(cap)
            message = await receive()
            if cap and message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    raise BodyTooLarge(cap)
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, guarded, watched)
        except HTTPException as exc:  # raised by `guarded` in a reader that did not answer it
            if started or not (exc is _last_refusal(scope) or isinstance(exc, BodyTooLarge)):
                raise
            await _answer(exc, scope, receive, send)

    def _plan(self, route: Any) -> tuple[tuple[AuthCheck, ...], bool]:
        """The route's header-only auth checks, and whether it streams its body itself."""
        if not isinstance(route, APIRoute):
            return (), False
        plan = self._plans.get(id(route))
        if plan is None:
            calls = (d.call for d in _walk(route.dependant) if d.call in HEADER_CHECKS)
            plan = (tuple(dict.fromkeys(calls)), _declares_multipart(route))  # type: ignore[arg-type]
            self._plans[id(route)] = plan
        return plan


def _body_headers(scope: Scope) -> tuple[int, bool]:
    declared, chunked = 0, False
    for key, value in scope["headers"]:
        if key == b"content-length":
            declared = int(value) if value.isdigit() else 0
        elif key == b"transfer-encoding":
            chunked = b"chunked" in value.lower()
    return declared, chunked


def _walk(dependant: Dependant) -> Iterator[Dependant]:
    for dep in dependant.dependencies:
        yield dep
        yield from _walk(dep)


def _declares_multipart(route: APIRoute) -> bool:
    """Routes documenting a multipart body read it with `service.api.multipart` (spooled,
    capped by the upload or result limit): the JSON cap is not theirs."""
    body: Any = (route.openapi_extra or {}).get("requestBody", {})
    return "multipart/form-data" in body.get("content", {})


async def _auth_refusal(scope: Scope, checks: tuple[AuthCheck, ...]) -> HTTPException | None:
    if not checks:
        return None
    app = scope.get("app")
    settings = getattr(getattr(app, "state", None), "settings", None)
    if settings is None:  # before start-up finished: the route's own dependencies decide
        return None
    request = Request(scope)  # no receive: reading the body here would raise
    credentials = await bearer(request)
    try:
        for check in checks:
            await check(request, settings, credentials)
    except HTTPException as exc:
        scope[_REFUSAL] = exc
        return exc
    return None


_REFUSAL = "fxtune.body_guard.refusal"


def _last_refusal(scope: Scope) -> HTTPException | None:
    return scope.get(_REFUSAL)


async def _answer(exc: HTTPException, scope: Scope, receive: Receive, send: Send) -> None:
    headers = dict(exc.headers or {})
    response = JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)
    await response(scope, receive, send)
