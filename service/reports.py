"""A worker's report.json, checked against the tuned-config contract and split into rows."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import ValidationError

from service.store import Profile, TuningResult
from tuner.contract.config import TunedConfig
from tuner.contract.errors import UnsupportedDeviceError
from tuner.contract.hardware import hardware_key

MAX_REPORT_BYTES = 32 * 1024 * 1024
PROFILE_KINDS = ("baseline", "tuned")


class ReportError(ValueError):
    """The report is not what `fxtune tune --report` writes."""


def config_etag(config: dict[str, Any]) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return '"' + hashlib.sha256(canonical.encode()).hexdigest()[:32] + '"'


def _no_constants(name: str) -> Any:
    """NaN and Infinity are not JSON: PostgreSQL's json type and strict clients refuse them."""
    raise ReportError(f"report contains {name}, which is not valid JSON")


def load_report(data: bytes) -> dict[str, Any]:
    report = load_json_report(data)
    if not isinstance(report.get("config"), dict):
        raise ReportError("report has no 'config' object")
    return report


def load_json_report(data: bytes) -> dict[str, Any]:
    """A report's JSON object, size-capped and strict (no NaN); any report_version."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"report larger than {MAX_REPORT_BYTES} bytes")
    try:
        report = json.loads(data, parse_constant=_no_constants)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportError(f"report is not JSON: {exc}") from None
    if not isinstance(report, dict):
        raise ReportError("report is not a JSON object")
    return report


def tuning_result(report: dict[str, Any], digests: dict[str, str]) -> TuningResult:
    """`digests`: sha256 of each stored part (report, program, aoti, trace_baseline, ...)."""
    raw = report["config"]
    try:
        config = TunedConfig.model_validate(raw)
    except ValidationError as exc:
        raise ReportError(f"config does not match the tuned-config schema: {exc}") from None
    try:
        key = hardware_key(config.hardware)
    except KeyError as exc:
        raise ReportError(f"config hardware lacks {exc}") from None
    except UnsupportedDeviceError as exc:
        raise ReportError(f"config hardware: {exc}") from None
    return TuningResult(
        config=raw,
        fingerprint=config.model_fingerprint,
        hardware=config.hardware,
        hardware_key=key[:255],
        backend=config.backend,
        speedup=config.whole_model.speedup,
        etag=config_etag(raw),
        program_sha256=digests["program"],
        aoti_sha256=digests.get("aoti"),
        report_sha256=digests["report"],
        profiles=_profiles(report.get("profiles"), digests),
        mode=config.mode,
        optimizer=config.training.optimizer if config.training else None,
    )


def _profiles(raw: Any, digests: dict[str, str]) -> tuple[Profile, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ReportError("report 'profiles' is not an object")
    out = []
    for kind in PROFILE_KINDS:
        summary = raw.get(kind)
        if summary is None:
            continue
        if not isinstance(summary, dict):
            raise ReportError(f"profile {kind!r} is not an object")
        out.append(Profile(kind, summary, digests.get(f"trace_{kind}")))
    return tuple(out)
