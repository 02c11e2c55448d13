"""A tuning job's view of the caches many jobs share: read-only, and what it measured comes back
as data that is checked before it is merged.

A job runs an untrusted program, and a compiled one runs native code: were the shared decision
store writable from the job, that code could plant decisions that later, unrelated jobs are
served as cache hits (seen: a replaced `decisions.json` read by the next job). So a job reads a
snapshot of the stores (`snapshot`, bound read-only into its sandbox) and records what it
measures in its own output folder (`fxtune tune --cache-out`); the process that started it
merges those records (`merge_recorded`) only after the job succeeded, and only records that
parse as what the tuner writes, for this machine's hardware and for sites the job's verified
report names, never replacing a record already there. What a job can still plant is a decision
for a site its own program has: it steers which passes a later run tries, never what it ships
unverified, since every run checks and times its choice against the original and the peers.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.host.files import write_json

# Where the tuner's caches are kept by default: a folder of their own, apart from the deployment
# client's config cache (`tuner.deploy.client.DEFAULT_CACHE`), which a job never reaches.
DEFAULT_STORE = Path.home() / ".cache" / "fxtune" / "tuning" / "decisions.json"
DECISIONS = "decisions.json"
RECORDED = "cache"  # in a job's output folder: what it measured (`fxtune tune --cache-out`)
COMPILE_TIMES = "compile_times.json"
MAX_RECORDED_BYTES = 8 * 1024**2
MAX_RECORDS = 20_000
KEPT_COMPILES = 8  # compile times kept per key, newest last (`tuner.backends.compile_time`)

_TAG = re.compile(r"[A-Za-z0-9_.+@\-]{1,80}")
_SITE = re.compile(r"(?P<id>[0-9a-f]{16})(?:@[A-Za-z0-9_=;,.\-]{1,400})?")


def hardware_part(key: str) -> str:
    """A hardware key without its thread count: a job may tune on fewer threads than the
    worker's default, and its records hold for that machine all the same."""
    return key.rsplit("|t", 1)[0]


@dataclass
class Merged:
    """What a merge took and what it refused (each with why, for the log)."""

    decisions: int = 0
    compile_times: int = 0
    refused: list[str] = field(default_factory=list)


def snapshot(store: Path, into: Path) -> Path:
    """Copy the decision file `store` and the compile times beside it into the folder `into`;
    the decision file's path there (what the job's `--cache` names)."""
    into.mkdir(parents=True, exist_ok=True)
    for source, name in ((store, DECISIONS), (store.with_name(COMPILE_TIMES), COMPILE_TIMES)):
        if source.is_file():
            shutil.copyfile(source, into / name)
        else:
            (into / name).unlink(missing_ok=True)
    return into / DECISIONS


@contextlib.contextmanager
def _locked(store: Path) -> Iterator[None]:
    """One merger at a time per store (workers on one machine may share it)."""
    store.parent.mkdir(parents=True, exist_ok=True)
    with open(store.with_name(".fxtune-cache.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _read(path: Path, merged: Merged) -> dict[str, Any]:
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_RECORDED_BYTES:
        merged.refused.append(f"{path.name}: larger than {MAX_RECORDED_BYTES} bytes")
        return {}
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        merged.refused.append(f"{path.name}: not JSON")
        return {}
    if not isinstance(entries, dict) or len(entries) > MAX_RECORDS:
        merged.refused.append(f"{path.name}: not an object of at most {MAX_RECORDS} records")
        return {}
    return entries


def _decision(key: str, value: Any, hardware: str, sites: set[str]) -> str | None:
    """Why a recorded decision is refused, or None."""
    parts = key.split("::")
    if len(parts) != 4:
        return "not a decision key"
    key_hardware, backend, version, site = parts
    if hardware_part(key_hardware) != hardware:
        return "for other hardware"
    if not (_TAG.fullmatch(backend) and _TAG.fullmatch(version)):
        return "a malformed backend or pass version"
    match = _SITE.fullmatch(site)
    if match is None or match["id"] not in sites:
        return "for a site the job's report does not name"
    from pydantic import ValidationError

    from tuner.contract.config import SiteDecision

    try:
        decision = SiteDecision.model_validate(value)
    except ValidationError:
        return "not a site decision"
    if decision.site_id != match["id"]:
        return "a decision for another site than its key"
    return None


def _compile_times(key: str, value: Any, hardware: str) -> str | None:
    parts = key.split("::")
    if len(parts) != 2 or hardware_part(parts[0]) != hardware or not _TAG.fullmatch(parts[1]):
        return "not a compile-time key for this hardware"
    if not isinstance(value, list) or not 0 < len(value) <= KEPT_COMPILES:
        return "not a list of measurements"
    for item in value:
        if not (isinstance(item, list) and len(item) == 2):
            return "a malformed measurement"
        nodes, seconds = item
        if type(nodes) is not int or not 0 < nodes <= 10_000_000:
            return "an implausible node count"
        if type(seconds) not in (int, float) or not 0.1 <= seconds <= 86_400:
            return "an implausible compile time"
    return None


def merge_recorded(recorded: Path, store: Path, hardware: str, sites: set[str]) -> Merged:
    """Merge the records a job left in the folder `recorded` into the stores beside the decision
    file `store`: decisions of `hardware` (a key without threads, `hardware_part`) for `sites`,
    compile times of `hardware`; existing decisions are kept, compile times appended."""
    merged = Merged()
    new_decisions = _read(recorded / DECISIONS, merged)
    new_times = _read(recorded / COMPILE_TIMES, merged)
    if not (new_decisions or new_times):
        return merged
    with _locked(store):
        decisions = _read(store, Merged())
        for key, value in new_decisions.items():
            why = _decision(key, value, hardware, sites)
            if why is None and key not in decisions:
                decisions[key] = value
                merged.decisions += 1
            elif why is not None:
                merged.refused.append(f"decision {key[:120]}: {why}")
        if merged.decisions:
            write_json(store, decisions)
        times_path = store.with_name(COMPILE_TIMES)
        times = _read(times_path, Merged())
        for key, value in new_times.items():
            why = _compile_times(key, value, hardware)
            if why is None:
                times[key] = [*(times.get(key) or []), *value][-KEPT_COMPILES:]
                merged.compile_times += 1
            else:
                merged.refused.append(f"compile times {key[:120]}: {why}")
        if merged.compile_times:
            write_json(times_path, times)
    return merged


def merge_job(out: Path, store: Path, machine: str | None = None) -> Merged:
    """Merge what a finished job measured (`out/cache`) into the stores beside `store`, for the
    sites its report (`out/report.json`) names and the hardware it ran on: `machine`, the key
    the caller trusts (a worker's, from its own probe), which the report must name; None: the
    report's own (a user's run on their machine)."""
    merged = Merged()
    try:
        report = json.loads((out / "report.json").read_text())
    except (OSError, ValueError):
        merged.refused.append("report.json is unreadable: nothing merged")
        return merged
    hardware, sites = report_sites(report)
    if hardware is None or (
        machine is not None and hardware_part(hardware) != hardware_part(machine)
    ):
        merged.refused.append("its report names no hardware, or other hardware: nothing merged")
        return merged
    return merge_recorded(out / RECORDED, store, hardware_part(hardware), sites)


def report_sites(report: dict[str, Any]) -> tuple[str | None, set[str]]:
    """(hardware key, site ids) a job's report (`report.json`, its `config`) names."""
    config = report.get("config") if isinstance(report, dict) else None
    if not isinstance(config, dict):
        return None, set()
    from tuner.contract.hardware import hardware_key

    try:
        key = hardware_key(config["hardware"])
    except (KeyError, TypeError, ValueError):
        return None, set()
    sites = config.get("sites") or []
    ids = {s.get("site_id") for s in sites if isinstance(s, dict)}
    return key, {i for i in ids if isinstance(i, str)}
