"""Request dependencies: the app's settings, store and artifacts, and who may read or write."""

from __future__ import annotations

import ipaddress
import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from service.artifacts import ArtifactStore
from service.core.config import Settings
from service.store import AbstractStore

_bearer = HTTPBearer(auto_error=False, description="FXTUNE_API_TOKEN")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> AbstractStore:
    return request.app.state.store


def get_artifacts(request: Request) -> ArtifactStore:
    return request.app.state.artifacts


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[AbstractStore, Depends(get_store)]
ArtifactsDep = Annotated[ArtifactStore, Depends(get_artifacts)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def is_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _authorize(request: Request, settings: Settings, creds: Credentials, write: bool) -> None:
    """Token when one is configured; without one, only loopback clients get in (reads too)."""
    token = settings.token
    if creds is not None and token is not None:
        if secrets.compare_digest(creds.credentials.encode(), token.encode()):
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


def require_reader(request: Request, settings: SettingsDep, creds: Credentials) -> None:
    _authorize(request, settings, creds, write=False)


def require_writer(request: Request, settings: SettingsDep, creds: Credentials) -> None:
    _authorize(request, settings, creds, write=True)


Reader = Depends(require_reader)
Writer = Depends(require_writer)
