"""Measured decisions keyed by (hardware, backend, pass, site id), kept across runs and models.

The same block in two models, or the same model tuned twice, is measured once per hardware.
A JSON file is enough: entries are small, written once, and read at the start of a run.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


class DecisionCache:
    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] = {}
        if path is not None and path.exists():
            try:
                entries = json.loads(path.read_text())
            except (OSError, ValueError):
                entries = {}  # a corrupt cache only costs re-measuring
            # Another fxtune's (or torch's) cache may hold anything: keep only what can be an entry.
            if isinstance(entries, dict):
                self._entries = {k: v for k, v in entries.items() if isinstance(v, dict)}
        self.hits = 0

    @staticmethod
    def key(hardware: str, backend: str, pass_version: str, site_id: str) -> str:
        return f"{hardware}::{backend}::{pass_version}::{site_id}"

    def get(self, key: str) -> dict[str, Any] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self.hits += 1
        return entry

    def put(self, key: str, entry: dict[str, Any]) -> None:
        self._entries[key] = entry
        self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(self._entries, f)
        os.replace(tmp, self.path)
