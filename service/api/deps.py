"""Request dependencies: the app's settings, store and artifacts, and who may read or write."""

from __future__ import annotations

import ipaddress
import secrets
import time
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.analysis import ProgramAnalysis
from service.api.config_cache import ConfigCache
from service.api.identity import (
    LOOPBACK_IDENTITY,
    SESSION_COOKIE,
    session_identity,
    token_identity,
)
from service.artifacts import ArtifactStore
from service.core.config import Settings
from service.quotas import Quotas
from service.store import AbstractStore

bearer = HTTPBearer(auto_error=False, description="FXTUNE_API_TOKEN")
READ_METHODS = frozenset({"GET", "HEAD"})


# The dependencies are `async def` although they never wait: FastAPI runs plain `def`
# dependencies in the thread pool, a hop per dependency per request that the config path
# (polled by every deployment) should not pay.


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> AbstractStore:
    return request.app.state.store


async def get_artifacts(request: Request) -> ArtifactStore:
    return request.app.state.artifacts


async def get_config_cache(request: Request) -> ConfigCache:
    return request.app.state.config_cache


async def get_analysis(request: Request) -> ProgramAnalysis:
    return request.app.state.analysis


async def get_quotas(request: Request) -> Quotas:
    return request.app.state.quotas


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[AbstractStore, Depends(get_store)]
ArtifactsDep = Annotated[ArtifactStore, Depends(get_artifacts)]
ConfigCacheDep = Annotated[ConfigCache, Depends(get_config_cache)]
AnalysisDep = Annotated[ProgramAnalysis, Depends(get_analysis)]
QuotasDep = Annotated[Quotas, Depends(get_quotas)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def is_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_secret(given: str, secret: str) -> bool:
    return secrets.compare_digest(given.encode(), secret.encode())


def _authorize(request: Request, settings: Settings, creds: Credentials, write: bool) -> str:
    """The caller's identity (`service.api.identity`), or the refusal.

    With a token configured every request needs it, from any address: the bearer header, or
    for reads (GET, HEAD) the dashboard's session cookie; a cookie never authorises a write
    (a browser attaches cookies to requests it did not mean to send). Without a token, only
    loopback clients get in, reads and writes alike."""
    token = settings.token
    if token is None:
        if is_loopback(request):
            return LOOPBACK_IDENTITY
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this service has no FXTUNE_API_TOKEN, so it only accepts requests from loopback",
        )
    if creds is not None:
        if _same_secret(creds.credentials, token):
            return token_identity(token)
        raise HTTPException(status.HTTP_403_FORBIDDEN, "invalid API token")
    if not write and request.method in READ_METHODS:
        cookie = request.cookies.get(SESSION_COOKIE)
        identity = session_identity(cookie, token, time.time())
        if identity is not None:
            return identity
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        "a bearer token (FXTUNE_API_TOKEN) is required"
        + ("" if write else "; the dashboard signs in at /login"),
        headers={"WWW-Authenticate": "Bearer"},
    )


def check_reader(request: Request, settings: Settings, creds: Credentials) -> str:
    return _authorize(request, settings, creds, write=False)


async def require_reader(request: Request, settings: SettingsDep, creds: Credentials) -> str:
    return _authorize(request, settings, creds, write=False)


async def require_writer(request: Request, settings: SettingsDep, creds: Credentials) -> str:
    return _authorize(request, settings, creds, write=True)


async def require_worker(request: Request, settings: SettingsDep, creds: Credentials) -> None:
    """The claim takes the worker token only: a user cannot claim jobs (what a claim returns,
    the lease token, then authorises that one job).

    With no token configured at all (loopback mode), loopback workers need none.
    """
    worker, user = settings.worker_secret, settings.token
    if worker is None and user is None:
        if is_loopback(request):
            return
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this service has no FXTUNE_WORKER_TOKEN, so it only accepts workers on loopback",
        )
    if creds is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "a worker bearer token (FXTUNE_WORKER_TOKEN) is required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if worker is not None and _same_secret(creds.credentials, worker):
        return
    if user is not None and _same_secret(creds.credentials, user):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "the user token (FXTUNE_API_TOKEN) cannot act as a worker; "
            "workers authenticate with FXTUNE_WORKER_TOKEN",
        )
    if worker is None:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this service has no FXTUNE_WORKER_TOKEN, so no worker can authenticate; "
            "set it for the service and its workers",
        )
    raise HTTPException(status.HTTP_403_FORBIDDEN, "invalid worker token")


Reader = Depends(require_reader)
Writer = Depends(require_writer)
WorkerAuth = Depends(require_worker)
# The identity of an authorised caller: the same dependency, so it runs once per request.
ReaderIdentity = Annotated[str, Reader]
WriterIdentity = Annotated[str, Writer]
