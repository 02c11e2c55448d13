"""The dashboard's HTML pages, rendered on the server from the same store the API reads."""

from __future__ import annotations

import secrets
import time
from typing import Annotated, Any, get_args

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from service.api.deps import SettingsDep, StoreDep
from service.api.identity import SESSION_COOKIE, issue_session
from service.api.routes.quota import quota_of
from service.api.schemas import Device, IdPath
from service.dashboard import format as fmt
from service.dashboard import views
from service.dashboard.auth import LoginRequired, local_path, login_form, require_page_reader
from service.package_data import package_dir
from service.store import NotFound
from tuner.contract.config import Mode
from tuner.contract.training import OPTIMIZER_NAMES

STATIC_DIR = package_dir("service.dashboard", "static")
DEVICES = get_args(Device)

# Everything is served from here; data reaches scripts as JSON blocks, never as inline code.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

templates = Jinja2Templates(directory=package_dir("service.dashboard", "templates"))
templates.env.filters.update(fmt.filters())

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_page_reader)])
# The sign-in and sign-out, open to everyone (the sign-in checks what it is given).
sign_in = APIRouter(include_in_schema=False)
PageReader = Annotated[str, Depends(require_page_reader)]


def page(
    request: Request,
    settings: SettingsDep,
    name: str,
    context: dict[str, Any],
    status: int = 200,
    signed_in: bool = True,
) -> HTMLResponse:
    context = {
        "token_required": settings.token is not None,
        "signed_in": signed_in,
        "devices": DEVICES,
        "optimizers": list(OPTIMIZER_NAMES),
        **context,
    }
    return templates.TemplateResponse(
        request, name, context, status_code=status, headers=SECURITY_HEADERS
    )


@router.get("/", response_class=HTMLResponse)
def index(
    request: Request, store: StoreDep, settings: SettingsDep, caller: PageReader
) -> HTMLResponse:
    models, rows, jobs = views.index_rows(store)
    names = {m.id: m.name for m in models}
    state = request.app.state
    context = {
        "quota": quota_of(caller, store, state.quotas, state.analysis),
        "models": models,
        "rows": rows,
        "tuned_ids": {r["model_id"] for r in rows},
        "jobs": jobs,
        "workers": views.worker_rows(jobs),
        "model_names": names,
        "chart": views.speedup_chart(rows),
        "hardware_label": views.hardware_label,
        "mode_label": views.mode_label,
    }
    return page(request, settings, "index.html", context)


@router.get("/models/{model_id}", response_class=HTMLResponse)
def model(
    model_id: IdPath,
    request: Request,
    store: StoreDep,
    settings: SettingsDep,
    device: Annotated[Device | None, Query()] = None,
    hardware: Annotated[str | None, Query()] = None,
    mode: Annotated[Mode | None, Query()] = None,
) -> HTMLResponse:
    try:
        view = views.model_page(store, model_id, device, hardware, mode)
    except NotFound as exc:
        return page(request, settings, "not_found.html", {"detail": str(exc)}, status=404)
    context = {
        "view": view,
        "model_names": {view.model.id: view.model.name},
        "hardware_label": views.hardware_label,
        "key_label": views.key_label,
        "tab_label": views.tab_label,
        "mode_label": views.mode_label,
    }
    return page(request, settings, "model.html", context)


def login_page(request: Request, exc: Exception) -> Response:
    """A refused page: the sign-in form, back to the page asked for once signed in."""
    assert isinstance(exc, LoginRequired)
    settings = request.app.state.settings
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    context = {"detail": exc.detail, "status": exc.status_code, "next": local_path(here)}
    return page(request, settings, "login.html", context, exc.status_code, signed_in=False)


@sign_in.get("/login", response_class=HTMLResponse)
def login(request: Request, settings: SettingsDep, next: str = "/") -> HTMLResponse:
    context = {"detail": None, "status": 200, "next": local_path(next)}
    return page(request, settings, "login.html", context, signed_in=False)


@sign_in.post("/login", response_class=HTMLResponse)
async def post_login(request: Request, settings: SettingsDep) -> Response:
    """A session cookie for the right token, then back where the browser came from."""
    token, target = await login_form(request)
    secret = settings.token
    if secret is None:  # no-token mode: nothing to sign in to
        return RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
    if not token or not secrets.compare_digest(token.encode(), secret.encode()):
        context = {"detail": "invalid API token", "status": 403, "next": target}
        return page(request, settings, "login.html", context, 403, signed_in=False)
    lifetime = settings.session_hours * 3600
    response = RedirectResponse(target, status_code=303, headers=SECURITY_HEADERS)
    response.set_cookie(
        SESSION_COOKIE,
        issue_session(secret, time.time(), lifetime),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@sign_in.post("/logout")
def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303, headers=SECURITY_HEADERS)
    response.delete_cookie(
        SESSION_COOKIE,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response
