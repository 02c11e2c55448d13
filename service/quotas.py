"""Quotas per caller identity: queued and running jobs, stored upload bytes, uploads per minute.

A caller is `service.api.identity`'s name for it (a hash of its token; `loopback` in no-token
mode). Jobs and bytes are counted by the store, which checks and charges them in the
transaction that adds them (`OverQuota`), so concurrent requests cannot slip past together.
Uploads per minute are counted here, per service process: a sliding 60 s window of the uploads
each caller started (refused ones do not count). The cheap checks run before an upload's body is
read and before its check child starts, so a caller over quota costs no check.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from service.core.config import Settings
from service.store import OverQuota, OwnerUsage

WINDOW_S = 60.0
# When a refusal may pass: jobs end as workers take them; stored bytes stay until an operator
# removes uploads, so a client is told to come back much later.
RETRY_AFTER_S = {"active_jobs": 30, "stored_bytes": 3600}
MB = 1024 * 1024


def retry_after(exc: OverQuota) -> int:
    return exc.retry_after_s or RETRY_AFTER_S.get(exc.kind, 60)


@dataclass(frozen=True)
class QuotaLimits:
    """None: no limit."""

    active_jobs: int | None
    stored_bytes: int | None
    uploads_per_minute: int | None

    @classmethod
    def from_settings(cls, settings: Settings) -> QuotaLimits:
        return cls(
            active_jobs=settings.quota_active_jobs or None,
            stored_bytes=int(settings.quota_stored_mb * MB) or None,
            uploads_per_minute=settings.quota_uploads_per_minute or None,
        )


class UploadWindow:
    """Uploads started per identity in the last `window_s`, refused past `limit`."""

    def __init__(
        self,
        limit: int | None,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.clock = clock
        self._lock = threading.Lock()
        self._starts: dict[str, deque[float]] = {}

    def _recent(self, identity: str, now: float) -> deque[float]:
        starts = self._starts.setdefault(identity, deque())
        while starts and starts[0] <= now - self.window_s:
            starts.popleft()
        return starts

    def admit(self, identity: str) -> None:
        """Count an upload, or raise OverQuota with the seconds until the oldest leaves."""
        if self.limit is None:
            return
        with self._lock:
            now = self.clock()
            starts = self._recent(identity, now)
            if len(starts) >= self.limit:
                wait = max(1, math.ceil(starts[0] + self.window_s - now))
                raise OverQuota(
                    f"this token started {len(starts)} uploads in the last "
                    f"{self.window_s:g} s, its quota (FXTUNE_QUOTA_UPLOADS_PER_MINUTE="
                    f"{self.limit}); try again in {wait} s",
                    "uploads_per_minute",
                    wait,
                )
            starts.append(now)

    def forget(self, identity: str) -> None:
        """Take back the newest upload counted (one the service itself turned away)."""
        with self._lock:
            starts = self._starts.get(identity)
            if starts:
                starts.pop()

    def count(self, identity: str) -> int:
        with self._lock:
            starts = self._recent(identity, self.clock())
            if not starts:
                self._starts.pop(identity, None)
            return len(starts)


@dataclass(frozen=True)
class Use:
    used: int
    limit: int | None


class Quotas:
    """The limits, the upload window, and the pre-checks of an upload."""

    def __init__(self, limits: QuotaLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.uploads = UploadWindow(limits.uploads_per_minute, clock=clock)

    def admit_upload(self, identity: str, usage: OwnerUsage) -> None:
        """Before the body is read: uploads already fill the stored bytes, or too many started."""
        cap = self.limits.stored_bytes
        if cap is not None and usage.stored_bytes >= cap:
            raise OverQuota(
                f"this token's uploads fill its storage quota ({_mib(usage.stored_bytes)} of "
                f"{_mib(cap)}, FXTUNE_QUOTA_STORED_MB); an operator must remove some first",
                "stored_bytes",
            )
        self.uploads.admit(identity)

    def before_check(self, usage: OwnerUsage, new_bytes: int, tune: bool) -> None:
        """Before the upload's check child: refusals the store would give after it."""
        cap = self.limits.stored_bytes
        if cap is not None and usage.stored_bytes + new_bytes > cap:
            raise OverQuota(
                f"storing these {_mib(new_bytes)} would take this token's uploads to "
                f"{_mib(usage.stored_bytes + new_bytes)}, past its quota of {_mib(cap)} "
                "(FXTUNE_QUOTA_STORED_MB); nothing was stored",
                "stored_bytes",
            )
        jobs = self.limits.active_jobs
        if tune and jobs is not None and usage.active_jobs >= jobs:
            raise OverQuota(
                f"this token has {usage.active_jobs} jobs queued or running, its quota "
                f"(FXTUNE_QUOTA_ACTIVE_JOBS={jobs}); nothing was stored: upload again once some "
                "have finished, or without tune=true",
                "active_jobs",
            )

    def usage(self, identity: str, usage: OwnerUsage) -> dict[str, Use]:
        return {
            "active_jobs": Use(usage.active_jobs, self.limits.active_jobs),
            "stored_bytes": Use(usage.stored_bytes, self.limits.stored_bytes),
            "uploads_per_minute": Use(self.uploads.count(identity), self.limits.uploads_per_minute),
        }


def _mib(size: int) -> str:
    return f"{size / MB:.1f} MiB"
