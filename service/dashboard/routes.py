"""The dashboard's HTML pages, rendered on the server from the same store the API reads."""

from __future__ import annotations

from typing import Annotated, Any, get_args

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from service.api.deps import SettingsDep, StoreDep
from service.api.schemas import Device, IdPath
from service.dashboard import format as fmt
from service.dashboard import views
from service.dashboard.auth import TOKEN_COOKIE, LoginRequired, require_page_reader
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


def page(
    request: Request, settings: SettingsDep, name: str, context: dict[str, Any], status: int = 200
) -> HTMLResponse:
    context = {
        "token_required": settings.token is not None,
        "token_cookie": TOKEN_COOKIE,
        "devices": DEVICES,
        "optimizers": list(OPTIMIZER_NAMES),
        **context,
    }
    return templates.TemplateResponse(
        request, name, context, status_code=status, headers=SECURITY_HEADERS
    )


@router.get("/", response_class=HTMLResponse)
def index(request: Request, store: StoreDep, settings: SettingsDep) -> HTMLResponse:
    models, rows, jobs = views.index_rows(store)
    names = {m.id: m.name for m in models}
    context = {
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
    assert isinstance(exc, LoginRequired)
    settings = request.app.state.settings
    context = {"detail": exc.detail, "status": exc.status_code}
    return page(request, settings, "login.html", context, status=exc.status_code)
