"""uvicorn's access log keeps the workers' polls at DEBUG (service.access_log)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from service.access_log import ACCESS_LOGGER, log_config


def _request(method: str, path: str, status: int) -> logging.LogRecord:
    return logging.LogRecord(
        ACCESS_LOGGER, logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", method, path, "1.1", status), None,
    )  # fmt: skip


@pytest.fixture
def access_filter() -> Iterator[logging.Filter]:
    """The filter `log_config()` puts on uvicorn's access handler, at uvicorn's INFO level."""
    config = log_config()
    assert config["handlers"]["access"]["filters"] == ["worker_polls"]
    logger = logging.getLogger(ACCESS_LOGGER)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield config["filters"]["worker_polls"]["()"]()
    logger.setLevel(level)


POLLS = [("POST", "/api/v1/jobs/claim", 204), ("POST", "/api/v1/jobs/12/heartbeat", 200)]
KEPT = [
    ("POST", "/api/v1/jobs/claim", 200),  # a job handed out
    ("POST", "/api/v1/jobs/12/heartbeat", 409),  # a lease lost
    ("POST", "/api/v1/models", 201),
    ("GET", "/api/v1/jobs/claim", 405),
    ("GET", "/", 200),
]


@pytest.mark.parametrize("request_", POLLS, ids=str)
def test_a_poll_is_debug(access_filter: logging.Filter, request_: tuple) -> None:
    record = _request(*request_)
    assert not access_filter.filter(record)
    assert record.levelname == "DEBUG"
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.DEBUG)  # `--log-level debug`
    assert access_filter.filter(_request(*request_))


@pytest.mark.parametrize("request_", KEPT, ids=str)
def test_everything_else_stays_info(access_filter: logging.Filter, request_: tuple) -> None:
    record = _request(*request_)
    assert access_filter.filter(record)
    assert record.levelname == "INFO"
