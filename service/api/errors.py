"""The error responses each route documents in OpenAPI: every status it can answer with.

All errors share one body, `{"detail": ...}`: a message, or FastAPI's list of field errors (422).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

DESCRIPTIONS = {
    400: "Malformed request body (JSON or multipart)",
    401: "A bearer token is required",
    403: "Refused: wrong token, not loopback, a foreign Host, or a cross-site write",
    404: "No such model, job, config or file",
    409: "The lease is not this worker's (a newer attempt owns the job, or it has finished)",
    413: "The upload is larger than the configured limit",
    415: "Not multipart/form-data, or not a torch.export .pt2 archive",
    422: "Invalid parameters or body, or an upload or result that fails validation",
    429: "A quota of this token (FXTUNE_QUOTA_*) is used up; Retry-After says when to retry",
    500: "Checking the file failed with an internal error (the server's fault; nothing stored)",
    503: "The database does not answer, the upload checker cannot run here, or every check "
    "slot is taken and the queue is full (Retry-After); nothing stored",
}


class ErrorOut(BaseModel):
    detail: Any = Field(description="A message, or a list of field errors")


RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds after which the request may pass",
        "schema": {"type": "integer"},
    }
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` for a route: 403 always (the Host check applies to every request)."""
    out: dict[int | str, dict[str, Any]] = {}
    for code in sorted({403, *codes}):
        out[code] = {"model": ErrorOut, "description": DESCRIPTIONS[code]}
        if code in (429, 503):
            out[code]["headers"] = RETRY_AFTER
    return out
