"""Results as CSV (pandas) for people who analyse them elsewhere: spreadsheets, notebooks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.api.deps import Reader, StoreDep
from service.api.errors import errors
from service.api.schemas import Device, IdPath, ModeQuery
from service.rows import Row, model_rows, site_rows

router = APIRouter(tags=["exports"])

MODEL_COLUMNS = (
    "model_id",
    "model",
    "device",
    "mode",
    "hardware_key",
    "hardware",
    "threads",
    "torch",
    "backend",
    "chosen",
    "original_kept",
    "verdict",
    "speedup",
    "ci_low",
    "ci_high",
    "baseline_s",
    "candidate_s",
    "sites",
    "sites_accepted",
    "verified",
    "fingerprint",
    "job_id",
    "updated_at",
)
SITE_COLUMNS = (
    "model_id",
    "device",
    "mode",
    "hardware_key",
    "pass",
    "site_id",
    "summary",
    "count",
    "baseline_s",
    "candidate_s",
    "speedup",
    "ci_low",
    "ci_high",
    "rounds",
    "time_saved_s",
    "verdict",
    "accepted",
    "cached",
    "reason",
)
CSV = {200: {"content": {"text/csv": {}}}}
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection, OWASP).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralize(value: object) -> object:
    """Text that a spreadsheet would evaluate gets a leading `'`; numbers stay numbers."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def csv_response(rows: Sequence[Row], columns: Sequence[str], filename: str) -> Response:
    """Floats keep full precision (repr), so a CSV reads back to the API's numbers. pandas is
    imported here, on the first export: a second of every service start for a rare request."""
    import pandas as pd

    safe = [{k: neutralize(v) for k, v in row.items()} for row in rows]
    frame = pd.DataFrame(safe, columns=list(columns))
    # CRLF line ends (RFC 4180) also make the writer quote a bare CR inside a cell.
    return Response(
        frame.to_csv(index=False, lineterminator="\r\n"),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{filename}"'},
    )


@router.get(
    "/exports/models.csv",
    dependencies=[Reader],
    response_class=Response,
    responses={**CSV, **errors(401)},
)
def models_csv(store: StoreDep) -> Response:
    """One row per tuned config (model x device x mode x hardware): whole-model speedup and
    interval."""
    return csv_response(model_rows(store), MODEL_COLUMNS, "fxtune-models.csv")


@router.get(
    "/models/{model_id}/sites.csv",
    dependencies=[Reader],
    response_class=Response,
    responses={**CSV, **errors(401, 404, 422)},
)
def sites_csv(
    model_id: IdPath,
    store: StoreDep,
    device: Annotated[Device, Query()] = "cpu",
    hardware: Annotated[str | None, Query()] = None,
    mode: ModeQuery = "infer",
) -> Response:
    """Every per-site decision of one tuned config, the biggest time saved first."""
    store.get_model(model_id)  # an unknown model is its own 404, not "no config yet"
    tuned = store.get_config(model_id, device, hardware, mode=mode)
    key = {
        "model_id": model_id,
        "device": device,
        "mode": mode,
        "hardware_key": tuned.summary.hardware_key,
    }
    rows = [{**key, **r} for r in site_rows(tuned.config)]
    name = f"fxtune-model-{model_id}-{device}{'' if mode == 'infer' else '-' + mode}-sites.csv"
    return csv_response(rows, SITE_COLUMNS, name)
