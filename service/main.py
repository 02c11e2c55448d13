"""The FastAPI application: migrations on start, the lease reaper, the warm checkers (started
and stopped with the app), and JSON errors everywhere."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.analysis import (
    AnalysisFailed,
    AnalysisUnavailable,
    ProgramAnalysis,
    program_analysis,
)
from service.api.body_guard import BodyGuard
from service.api.browser import BrowserGuard
from service.api.config_cache import ConfigCache
from service.api.config_fast_path import ConfigFastPath
from service.api.excerpts import MAX_DETAIL_CHARS, bounded_errors, excerpt
from service.api.main import api_router
from service.api.routes import health
from service.artifacts import ArtifactStore
from service.check_gate import ChecksBusy
from service.core.config import Settings, get_settings
from service.dashboard import mount as mount_dashboard
from service.db.engine import make_engine
from service.db.migrate import upgrade_to_head
from service.quotas import QuotaLimits, Quotas, retry_after
from service.store import NotFound, OverQuota, QueuePolicy, StaleLease, StoreError
from service.store.abstract import AbstractStore
from service.store.sqlalchemy_store import SqlAlchemyStore

log = logging.getLogger("fxtune.service")

API_PREFIX = "/api/v1"


def queue_policy(settings: Settings) -> QueuePolicy:
    return QueuePolicy(
        lease_s=settings.lease_s,
        max_attempts=settings.max_attempts,
        backoff_s=settings.retry_backoff_s,
        backoff_max_s=settings.retry_backoff_max_s,
    )


async def reap_forever(store: AbstractStore, interval_s: float) -> None:
    """Requeue jobs whose worker went silent, even while no worker is claiming."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            reaped = await run_in_threadpool(store.requeue_expired)
        except Exception:
            log.exception("reaper failed; trying again in %ss", interval_s)
            continue
        if reaped:
            log.warning("requeued %d job(s) with expired leases", reaped)


def log_access_mode(settings: Settings, analysis: ProgramAnalysis) -> None:
    """Say at start-up who may come in, and how many checks run at once."""
    if settings.token is None:
        log.warning(
            "no-token mode: FXTUNE_API_TOKEN is not set, so only loopback clients get in, "
            "without a token (reads and writes); set FXTUNE_API_TOKEN to serve anyone else"
        )
    else:
        log.info("FXTUNE_API_TOKEN is set: every read and write needs it, from any address")
    if analysis.gate is not None:
        log.info("checks of uploads and results: %s", analysis.gate.capacity.describe())


def create_app(
    settings: Settings | None = None,
    checks: Callable[[Settings], ProgramAnalysis] = program_analysis,
) -> FastAPI:
    """The service; `checks` makes the checker of uploads and results from the settings (the
    sandboxed children of `service.analysis`; tests of the API around them may run them
    in-process)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(settings.resolved_database_url)
        await run_in_threadpool(upgrade_to_head, engine)
        artifacts = ArtifactStore(settings.artifacts_dir)
        artifacts.clear_tmp()
        store = SqlAlchemyStore(engine, queue_policy(settings))
        app.state.settings = settings
        app.state.engine = engine
        app.state.store = store
        app.state.artifacts = artifacts
        app.state.config_cache = ConfigCache(settings.config_cache_ttl_s)
        app.state.quotas = Quotas(QuotaLimits.from_settings(settings))
        analysis = checks(settings)
        await run_in_threadpool(analysis.start)
        app.state.analysis = analysis
        log_access_mode(settings, analysis)
        reaper = asyncio.create_task(reap_forever(store, settings.reap_interval_s))
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await run_in_threadpool(analysis.close)
            engine.dispose()

    app = FastAPI(
        title="fxtune",
        summary="Profiling-driven autotuning of torch.export programs",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.include_router(api_router, prefix=API_PREFIX)
    app.include_router(health.router, include_in_schema=False)  # /healthz at the root too
    mount_dashboard(app)
    _add_error_handlers(app)
    app.add_middleware(ConfigFastPath)  # inside the guards: the last added runs first
    app.add_middleware(BodyGuard, max_json_bytes=settings.max_json_kb * 1024)
    app.add_middleware(BrowserGuard, allowed_hosts=settings.allowed_hosts)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    def store_error(_: Request, exc: Exception) -> JSONResponse:
        code = status.HTTP_404_NOT_FOUND if isinstance(exc, NotFound) else status.HTTP_409_CONFLICT
        return JSONResponse({"detail": str(exc)}, status_code=code)

    def checker_error(_: Request, exc: Exception) -> JSONResponse:
        """The server's fault, never a verdict on the file: 503 where the checker cannot run
        here, 500 where it failed (a bug); nothing was stored either way."""
        unavailable = isinstance(exc, AnalysisUnavailable)
        code = (
            status.HTTP_503_SERVICE_UNAVAILABLE
            if unavailable
            else status.HTTP_500_INTERNAL_SERVER_ERROR
        )
        return JSONResponse({"detail": str(exc)}, status_code=code)

    def validation_error(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        bad_json = [e for e in errors if e.get("type") == "json_invalid"]
        if bad_json:
            msg = excerpt(str(bad_json[0].get("ctx", {}).get("error", "invalid JSON")))
            return JSONResponse({"detail": f"malformed JSON body: {msg}"}, status_code=400)
        return JSONResponse({"detail": bounded_errors(list(errors))}, status_code=422)

    async def http_error(request: Request, exc: Exception) -> Response:
        """Messages that quote client input (names, archive members) are cut to an excerpt."""
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc.detail, str) and len(exc.detail) > MAX_DETAIL_CHARS:
            cut = excerpt(exc.detail, MAX_DETAIL_CHARS)
            exc = StarletteHTTPException(exc.status_code, cut, exc.headers)
        return await http_exception_handler(request, exc)

    def over_quota(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, OverQuota)
        headers = {"Retry-After": str(retry_after(exc))}
        return JSONResponse({"detail": str(exc)}, status_code=429, headers=headers)

    def checks_busy(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ChecksBusy)
        headers = {"Retry-After": str(exc.retry_after_s)}
        return JSONResponse({"detail": str(exc)}, status_code=503, headers=headers)

    app.add_exception_handler(OverQuota, over_quota)
    app.add_exception_handler(ChecksBusy, checks_busy)
    app.add_exception_handler(NotFound, store_error)
    app.add_exception_handler(StaleLease, store_error)
    app.add_exception_handler(StoreError, store_error)
    app.add_exception_handler(AnalysisUnavailable, checker_error)
    app.add_exception_handler(AnalysisFailed, checker_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
