"""A temp folder warmed once by the worker, copied into each job's (worker/warm_temp.py).

The warm-up here is a stand-in that writes one file where inductor keeps its precompiled
headers; the real build (`tuner.backends.warm_cache`) is timed in the closing note, not here.
The worker's use of it, a job's tuner finding the copy: tests/worker/test_loop.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.worker.fake_tune import WARM_FILE, warm_command
from tuner.host.sandbox import Limits, Sandbox
from worker.warm_temp import WarmTemp


def test_a_job_folder_gets_a_copy_that_its_writes_leave_alone(tmp_path: Path) -> None:
    warm = WarmTemp(warm_command(), tmp_path / "scratch")  # made when the build starts
    assert not warm.seed(tmp_path)  # nothing built yet: the job runs cold
    warm.start(Limits(60), Sandbox())
    assert warm.wait(30)
    jobs = [tmp_path / "job1", tmp_path / "job2"]
    for job in jobs:
        job.mkdir()
        assert warm.seed(job)
    copied = jobs[0] / "tmp" / WARM_FILE
    assert copied.is_file() and not copied.is_symlink() and copied.read_text() == "warm"
    copied.write_text("written by a job")
    assert (jobs[1] / "tmp" / WARM_FILE).read_text() == "warm"
    warm.close()
    assert list((tmp_path / "scratch").iterdir()) == []  # the warm folder is gone
    assert not warm.seed(jobs[1])


@pytest.mark.parametrize("command", [[sys.executable, "-c", "raise SystemExit(3)"], []])
def test_a_failed_or_absent_warm_up_leaves_jobs_cold(tmp_path: Path, command: list[str]) -> None:
    warm = WarmTemp(command, tmp_path)
    warm.start(Limits(60), Sandbox())
    assert not warm.wait(30) and not warm.seed(tmp_path)
    warm.close()
