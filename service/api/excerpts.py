"""Short excerpts of client input for error bodies: an error never echoes more than a little of
what was sent (FastAPI's default 422 returned the whole input, so a 20 MB body got a 20 MB
answer), and building the excerpt never walks a large structure."""

from __future__ import annotations

import reprlib
from typing import Any

EXCERPT_CHARS = 120
MAX_DETAIL_CHARS = 2000
MAX_ERRORS = 20

_repr = reprlib.Repr()
_repr.maxlevel = 2
_repr.maxdict = _repr.maxlist = _repr.maxtuple = _repr.maxset = 4
_repr.maxstring = _repr.maxother = 60


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> Any:
    """Scalars as they are (strings cut to `limit`); anything else as a bounded repr string."""
    if value is None or isinstance(value, bool | float):
        return value
    if isinstance(value, int):
        return value if abs(value) < 2**63 else _cut(_repr.repr(value), limit)
    if isinstance(value, str):
        return _cut(value, limit)
    if isinstance(value, bytes):
        return _cut(value[: limit + 1].decode("utf-8", "replace"), limit, len(value))
    return _cut(_repr.repr(value), limit)


def _cut(text: str, limit: int, total: int | None = None) -> str:
    total = len(text) if total is None else total
    if total <= limit:
        return text
    return f"{text[:limit]}... ({total} chars)"


def bounded_errors(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic's field errors with every part that can carry input cut to an excerpt."""
    out = []
    for error in errors[:MAX_ERRORS]:
        item: dict[str, Any] = {
            "type": excerpt(error.get("type")),
            "loc": [excerpt(part) for part in error.get("loc", ())[:8]],
            "msg": excerpt(error.get("msg"), 500),
        }
        if "input" in error:
            item["input"] = excerpt(error["input"])
        ctx = error.get("ctx")
        if isinstance(ctx, dict):
            item["ctx"] = {excerpt(k): excerpt(v) for k, v in list(ctx.items())[:8]}
        out.append(item)
    if len(errors) > MAX_ERRORS:
        out.append({"type": "truncated", "loc": [], "msg": f"{len(errors)} errors in all"})
    return out
