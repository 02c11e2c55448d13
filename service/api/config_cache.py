"""Tuned configs in memory: what deployments poll, served without touching the database.

Entries hold the encoded body and its ETag, keyed by what the request names: a fingerprint or a
model id, the device, the mode, and the hardware key when given. Every config write for a
(fingerprint, device, mode) or (model, device, mode) drops that scope's entries in this process.
Other service processes sharing the database do not hear of it, so an entry also expires after
`ttl_s`: that is how stale a config can be there (docs/service.md).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ("fp", fingerprint, device, mode) or ("model", id, device, mode)
Scope = tuple[str, str | int, str, str]


def encode(config: dict[str, Any]) -> bytes:
    """The bytes JSONResponse would send for this config."""
    return json.dumps(config, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class CachedConfig:
    body: bytes
    etag: str
    hardware_key: str
    expires: float


class ConfigCache:
    def __init__(
        self, ttl_s: float, max_entries: int = 4096, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[Scope, str | None], CachedConfig] = OrderedDict()
        self._generations: dict[Scope, int] = {}
        self._lock = threading.Lock()

    def generation(self, scope: Scope) -> int:
        """Read before the database; `put` refuses the value if a write came in between."""
        with self._lock:
            return self._generations.get(scope, 0)

    def get(self, scope: Scope, hardware: str | None) -> CachedConfig | None:
        entry = self._entries.get((scope, hardware))
        if entry is None or entry.expires < self._clock():
            return None
        return entry

    def put(
        self,
        scope: Scope,
        hardware: str | None,
        generation: int,
        config: dict[str, Any],
        etag: str,
        hardware_key: str,
    ) -> CachedConfig:
        entry = CachedConfig(encode(config), etag, hardware_key, self._clock() + self.ttl_s)
        if self.ttl_s <= 0:
            return entry
        with self._lock:
            if self._generations.get(scope, 0) == generation:
                self._entries[(scope, hardware)] = entry
                self._entries.move_to_end((scope, hardware))
                while len(self._entries) > self.max_entries:
                    self._entries.popitem(last=False)
        return entry

    def invalidate(self, *scopes: Scope) -> None:
        with self._lock:
            for scope in scopes:
                self._generations[scope] = self._generations.get(scope, 0) + 1
            gone = set(scopes)
            for key in [k for k in self._entries if k[0] in gone]:
                del self._entries[key]
