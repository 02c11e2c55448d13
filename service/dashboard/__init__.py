"""The dashboard at `/`: speedups, per-site decisions, profiles, jobs and uploads, in HTML.

Pages are rendered on the server (Jinja2); the charts use Chart.js served from `/static`, so
nothing is fetched from another origin at run time.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from service.dashboard.auth import LoginRequired
from service.dashboard.routes import STATIC_DIR, login_page, router, sign_in


def mount(app: FastAPI) -> None:
    app.include_router(sign_in)
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.add_exception_handler(LoginRequired, login_page)
