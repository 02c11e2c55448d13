"""The decision store: measured site decisions keyed by (hardware, backend, pass, site id).

As TVM meta_schedule's database keeps raw tuning records, the search asks the store before it
measures a site and records what it measured, so the same block in two models, or the same model
tuned twice, is measured once per hardware. Two stores: in memory (one run) and a JSON file (kept
across runs and models; entries are small, written once, and read at the start of a run).

The records are typed (`SiteDecision`). A file holds them as JSON objects under their keys; one
written before the records were typed has the same fields and loads as is. What does not load as
a record (another program's file, an entry of another shape) is never served: the store says why
in `ignored`, and entries it could not read stay in the file as they were.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from tuner.contract.config import SiteDecision
from tuner.host.files import write_json


@dataclass(frozen=True)
class DecisionKey:
    """What a decision depends on: the hardware, the backend (and what one run of a site is),
    the pass's version (its code and torch's), and the site's structural id (with its sizes)."""

    hardware: str
    backend: str
    pass_version: str
    site_id: str

    def __str__(self) -> str:
        return f"{self.hardware}::{self.backend}::{self.pass_version}::{self.site_id}"


class DecisionCache(Protocol):
    """Where the search finds and records decisions."""

    @property
    def hits(self) -> int:
        """Decisions served so far."""
        ...

    @property
    def ignored(self) -> list[str]:
        """Why stored records were not loaded (empty when all were)."""
        ...

    def get(self, key: DecisionKey) -> SiteDecision | None: ...

    def put(self, key: DecisionKey, decision: SiteDecision) -> None: ...


class MemoryDecisionCache:
    """Decisions for one run: nothing is read or written."""

    def __init__(self, records: dict[str, SiteDecision] | None = None) -> None:
        self._records: dict[str, SiteDecision] = dict(records or {})
        self.hits = 0
        self.ignored: list[str] = []

    def get(self, key: DecisionKey) -> SiteDecision | None:
        found = self._records.get(str(key))
        if found is None:
            return None
        self.hits += 1
        return found.model_copy(deep=True)  # the caller's edits stay out of the store

    def put(self, key: DecisionKey, decision: SiteDecision) -> None:
        self._records[str(key)] = decision.model_copy(deep=True)

    def records(self) -> dict[str, SiteDecision]:
        return dict(self._records)


class JsonDecisionCache:
    """Decisions in a JSON file, read when opened and rewritten (atomically) on each put.

    With `record_to`, the file at `path` is only read, and what this run measures is written
    to `record_to` alone: a worker's jobs share one store that none of them may write (a job runs
    an untrusted program), and the worker merges a job's records after checking them
    (`tuner.host.job_caches`)."""

    def __init__(self, path: Path, record_to: Path | None = None) -> None:
        self.path = path
        self.record_to = record_to
        records, self._unread, why = _read(path)
        self._memory = MemoryDecisionCache(records)
        self._new: dict[str, SiteDecision] = {}
        self.ignored = why

    @property
    def hits(self) -> int:
        return self._memory.hits

    def get(self, key: DecisionKey) -> SiteDecision | None:
        return self._memory.get(key)

    def put(self, key: DecisionKey, decision: SiteDecision) -> None:
        self._memory.put(key, decision)
        if self.record_to is not None:
            self._new[str(key)] = decision
            write_json(self.record_to, _dumped(self._new))
            return
        self._unread.pop(str(key), None)
        write_json(self.path, {**self._unread, **_dumped(self._memory.records())})

    def records(self) -> dict[str, SiteDecision]:
        return self._memory.records()


def _dumped(records: dict[str, SiteDecision]) -> dict[str, Any]:
    return {k: d.model_dump(mode="json", by_alias=True) for k, d in records.items()}


def _read(path: Path) -> tuple[dict[str, SiteDecision], dict[str, Any], list[str]]:
    """(records, entries that are not records, why anything was ignored) of a store file."""
    if not path.exists():
        return {}, {}, []
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # a corrupt store only costs re-measuring
        return {}, {}, [f"{path.name} could not be read ({type(exc).__name__}): not used"]
    if not isinstance(entries, dict):
        return {}, {}, [f"{path.name} is not a JSON object of decisions by key: not used"]
    records: dict[str, SiteDecision] = {}
    unread: dict[str, Any] = {}
    for k, v in entries.items():
        try:
            records[k] = SiteDecision.model_validate(v)
        except ValidationError:
            unread[k] = v
    why = []
    if unread:
        why.append(
            f"{len(unread)} of {len(entries)} entries of {path.name} are not site decisions "
            "(another program's or version's): not used, and kept in the file as they were"
        )
    return records, unread, why


def open_decision_cache(path: Path | None, record_to: Path | None = None) -> DecisionCache:
    """The JSON file store at `path` (new records to `record_to` where given), or an in-memory
    store without one."""
    return MemoryDecisionCache() if path is None else JsonDecisionCache(path, record_to)
