"""Request dependencies: the app's settings, store and artifacts, and who may read or write."""

from __future__ import annotations

import ipaddress
import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.analysis import ProgramAnalysis
from service.api.config_cache import ConfigCache
from service.artifacts import ArtifactStore
from service.core.config import Settings
from service.store import AbstractStore

bearer = HTTPBearer(auto_error=False, description="FXTUNE_API_TOKEN")


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


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[AbstractStore, Depends(get_store)]
ArtifactsDep = Annotated[ArtifactStore, Depends(get_artifacts)]
ConfigCacheDep = Annotated[ConfigCache, Depends(get_config_cache)]
AnalysisDep = Annotated[ProgramAnalysis, Depends(get_analysis)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def is_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_secret(given: str, secret: str) -> bool:
    return secrets.compare_digest(given.encode(), secret.encode())


def _authorize(request: Request, settings: Settings, creds: Credentials, write: bool) -> None:
    """Token when one is configured; without one, only loopback clients get in (reads too)."""
    token = settings.token
    if creds is not None and token is not None:
        if _same_secret(creds.credentials, token):
            return
        raise HTTPException(status.HTTP_403_FORBIDDEN, "invalid API token")
    if token is None:
        if is_loopback(request):
            return
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this service has no FXTUNE_API_TOKEN, so it only accepts requests from loopback",
        )
    if not write and is_loopback(request):
        return
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        "a bearer token (FXTUNE_API_TOKEN) is required",
        headers={"WWW-Authenticate": "Bearer"},
    )


def check_reader(request: Request, settings: Settings, creds: Credentials) -> None:
    _authorize(request, settings, creds, write=False)


async def require_reader(request: Request, settings: SettingsDep, creds: Credentials) -> None:
    _authorize(request, settings, creds, write=False)


async def require_writer(request: Request, settings: SettingsDep, creds: Credentials) -> None:
    _authorize(request, settings, creds, write=True)


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
