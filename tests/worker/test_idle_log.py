"""An idle worker is quiet at the default log level: its claim polls log at DEBUG only."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.service.fakes import HARDWARE
from worker.config import WorkerSettings
from worker.loop import Worker


class NoJobs:
    """A service with nothing queued, that stops the worker after a few polls."""

    def __init__(self) -> None:
        self.polls = 0
        self.worker: Worker | None = None

    def claim(self, *args: Any, **kwargs: Any) -> None:
        self.polls += 1
        if self.polls == 5 and self.worker is not None:
            self.worker.stop()

    def close(self) -> None:
        pass


def test_polling_for_jobs_logs_nothing_at_info(caplog: pytest.LogCaptureFixture) -> None:
    settings = WorkerSettings(worker_sandbox="none", worker_warm_command=[], worker_poll_s=0.01)
    client = NoJobs()
    worker = Worker(settings, "cpu", HARDWARE, client)  # type: ignore[arg-type]
    client.worker = worker
    caplog.set_level(logging.DEBUG, logger="fxtune.worker")
    caplog.clear()  # what the worker said as it started (here: no sandbox) is not polling
    worker.run()
    assert client.polls == 5
    assert [r.getMessage() for r in caplog.records] == ["no job; asking again in 0.01s"] * 5
    assert {r.levelno for r in caplog.records} == {logging.DEBUG}
