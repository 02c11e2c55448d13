"""uvicorn's access log, with the workers' polls at DEBUG.

An idle worker asks for a job every couple of seconds (204: none) and a busy one sends a
heartbeat every few: at uvicorn's INFO level each was a line, so an idle `fxtune serve
--embedded-worker` printed 30 a minute of nothing. Those requests are logged at DEBUG
(`--log-level debug` shows them); a claim that hands out a job (200) and every other request
stay INFO.
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

ACCESS_LOGGER = "uvicorn.access"
WORKER_POLLS = re.compile(r"/api/v1/jobs/(claim|\d+/heartbeat)")
NO_JOB = 204


class WorkerPollsAtDebug(logging.Filter):
    """Demotes a successful claim poll or heartbeat to DEBUG, and drops it below that level."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not _is_poll(record.args):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(ACCESS_LOGGER).isEnabledFor(logging.DEBUG)


def _is_poll(args: Any) -> bool:
    """uvicorn's access record: (client, method, path with query, HTTP version, status)."""
    if not isinstance(args, tuple) or len(args) != 5:
        return False
    _, method, path, _, status = args
    if method != "POST" or not isinstance(status, int) or not 200 <= status < 300:
        return False
    match = WORKER_POLLS.fullmatch(str(path))
    if match is None:
        return False
    return match.group(1) != "claim" or status == NO_JOB


def log_config() -> dict[str, Any]:
    """uvicorn's own logging config with the filter on its access log."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["worker_polls"] = {"()": WorkerPollsAtDebug}
    config["handlers"]["access"].setdefault("filters", []).append("worker_polls")
    return config
