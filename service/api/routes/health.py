"""Liveness: answers only when the database does, so orchestrators restart a wedged service."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, status
from sqlalchemy.exc import SQLAlchemyError

from service.api.errors import errors
from service.api.schemas import Health
from service.db.migrate import current_revision

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses=errors(503))
def healthz(request: Request) -> Health:
    try:
        revision = current_revision(request.app.state.engine)
    except SQLAlchemyError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"database: {exc}") from None
    return Health(status="ok", schema_revision=revision or "none")
