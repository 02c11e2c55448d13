"""The worker against a real HTTP server (in a thread), with a fake tuner as the child."""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from service.core.config import Settings
from service.db.models import utcnow
from tests.service.fakes import HARDWARE
from tests.service.helpers import REPO, thread_server, tiny_program, wait_for
from tests.service.in_process_checks import in_process_checks
from tests.worker.fake_tune import WARM_FILE, warm_command
from tuner.contract.exit_codes import ExitCode
from tuner.host.sandbox import ChildResult, Sandbox
from worker.client import Assignment, ServiceClient, _raise_for
from worker.config import WorkerSettings
from worker.loop import Worker, _retryable, rank_result_files, result_files


class RecordingClient(ServiceClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.beats: list[tuple[float, str]] = []

    def heartbeat(self, job: Assignment, progress: float, message: str) -> None:
        self.beats.append((progress, message))
        super().heartbeat(job, progress, message)


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("programs") / "tiny.pt2"
    tiny_program(path)
    return path


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    """The service, its upload and result checks run in this process
    (tests/service/in_process_checks.py): these tests are about the worker, not the sandboxed
    checking child (tested by tests/service and the end-to-end tests), which costs a Python
    importing torch per upload and per result."""
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        lease_s=6,
        max_attempts=2,
        retry_backoff_s=0,
    )
    with thread_server(settings, checks=in_process_checks) as live:
        yield live


def make_worker(url: str, mode: str, monkeypatch: pytest.MonkeyPatch, **opts: Any) -> Worker:
    monkeypatch.setenv("FAKE_TUNE", mode)
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    settings = WorkerSettings(
        server=url,
        worker_tune_command=[sys.executable, "-m", "tests.worker.fake_tune"],
        worker_poll_s=0.1,
        worker_child_env=["FAKE_TUNE", "FAKE_TUNE_STEP_S"],  # the fake's knobs
        **opts,
    )
    return Worker(settings, "cpu", HARDWARE, RecordingClient(url, None))


def submit(url: str, program: Path) -> dict[str, Any]:
    with program.open("rb") as f:
        resp = httpx.post(
            f"{url}/api/v1/models",
            files={"file": f},
            data={"tune": "true", "budget_s": "3"},
            timeout=60,  # the upload is checked (a program load) before the answer
        )
    resp.raise_for_status()
    return resp.json()


def job_of(url: str, job_id: int) -> dict[str, Any]:
    return httpx.get(f"{url}/api/v1/jobs/{job_id}").json()


def test_a_job_is_tuned_and_its_result_stored(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = server
    model = submit(url, program)
    monkeypatch.setenv("FAKE_TUNE_STEP_S", "0.7")  # slower than the relay's 1 s rate limit
    worker = make_worker(url, "ok", monkeypatch)
    assert worker.run(once=True) == 1
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "succeeded" and job["attempts"] == 1 and job["worker_id"] == worker.id
    ((run_s,),) = [job["run_seconds"]]  # the run's wall time, in the job record
    assert 0 < run_s < 60
    assert any(m.startswith("step") for _, m in worker.client.beats)  # type: ignore[attr-defined]
    art = httpx.get(f"{url}/api/v1/models/{model['id']}/artifact", params={"device": "cpu"})
    assert art.status_code == 200 and art.content == program.read_bytes()
    report = httpx.get(f"{url}/api/v1/models/{model['id']}/report").json()
    assert set(report["artifacts"]["traces"]) == {"baseline", "tuned"}
    assert worker.run(once=True) == 0  # nothing left: --once returns


def test_a_job_starts_from_a_copy_of_the_worker_s_warm_temp_folder(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The fake tuner fails unless its temp folder holds the warm file as a plain file, then
    writes into it; the worker's own folder keeps what the warm-up wrote."""
    url, _ = server
    scratch = tmp_path / "scratch"
    worker = make_worker(
        url,
        "needs_warm",
        monkeypatch,
        worker_warm_command=warm_command(),
        worker_scratch_dir=scratch,
    )
    worker.warm.start(worker.cpu_limits(), Sandbox(worker.sandbox_kind))
    assert worker.warm.wait(30)
    model = submit(url, program)
    assert worker.run(once=True) == 1
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "succeeded", job
    (kept,) = scratch.glob(f"fxtune-warm-*/tmp/{WARM_FILE}")
    assert kept.read_text() == "warm"
    worker.close()
    assert list(scratch.iterdir()) == []


def test_a_crash_is_reported_with_its_last_line_and_retried(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = server
    model = submit(url, program)
    worker = make_worker(url, "fail", monkeypatch)
    worker.run(once=True)
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "queued" and job["error"] == "RuntimeError: it broke"
    worker.run(once=True)
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "failed" and job["attempts"] == 2


def test_a_refused_model_fails_at_once(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = server
    model = submit(url, program)
    make_worker(url, "user_error", monkeypatch).run(once=True)
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "failed" and job["attempts"] == 1
    assert job["error"] == "error: refused to load an archive member: nope"


def test_a_hung_tuner_times_out(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = server
    model = submit(url, program)
    make_worker(url, "sleep", monkeypatch, worker_timeout_s=2).run(once=True)
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "queued" and "timed out after 2s" in job["error"]


def test_a_job_past_its_budget_is_stopped_and_not_retried(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget binds the worker (round 3: a data-dependent loop ran for the worker's hour,
    three times over): the child is killed at budget + margin (here a margin that ends this
    job's 3 s budget at 1.5 s) and the job fails with the reason, its run's time recorded."""
    url, _ = server
    model = submit(url, program)
    monkeypatch.setattr("worker.loop.kill_after_s", lambda budget_s: budget_s - 1.5)
    began = time.monotonic()
    make_worker(url, "sleep", monkeypatch).run(once=True)
    assert time.monotonic() - began < 30
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "failed" and job["attempts"] == 1
    assert job["error"].startswith("tuning ran past its budget of 3 s")
    ((run_s,),) = [job["run_seconds"]]
    assert 1.5 <= run_s < 10


def test_a_lost_lease_stops_the_tuner_and_drops_the_result(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, app = server
    model = submit(url, program)
    worker = make_worker(url, "sleep", monkeypatch)
    claim = worker.client.claim(worker.id, "cpu", HARDWARE)
    assert claim is not None
    outcome: list[Any] = []
    runner = threading.Thread(target=lambda: outcome.append(worker.run_job(claim)))
    started = time.monotonic()
    runner.start()
    wait_for(lambda: any(m == "sleeping" for _, m in worker.client.beats), 30, "the tuner")  # type: ignore[attr-defined]
    app.state.store.requeue_expired(utcnow() + timedelta(hours=1))  # the server gives up on it
    runner.join(timeout=60)
    assert outcome and outcome[0].status == "lost"
    assert time.monotonic() - started < 30
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "queued" and "lease expired" in job["error"]


def test_result_files_stay_inside_the_output_folder(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text('{"artifacts": {"program": "../escape.pt2"}}')
    (tmp_path.parent / "escape.pt2").write_bytes(b"x")
    with pytest.raises(ValueError, match="outside"):
        result_files(tmp_path / "report.json")
    with pytest.raises(ValueError, match="no report"):
        result_files(tmp_path / "missing.json")


def test_the_tune_command_carries_the_machines_cache_and_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FXTUNE_WORKER_DECISION_CACHE")  # the suite's own (tests/run_settings.py)
    job = Assignment(1, 1, "cpu", 5.0, "token", 30.0, "0" * 64, 1, "m", "/file")
    plain = Worker(WorkerSettings(), "cpu", HARDWARE, ServiceClient("http://x", None))
    cmd = plain.command(job, tmp_path / "m.pt2", tmp_path / "out", tmp_path)
    assert "--threads" not in cmd and "--no-sandbox" in cmd  # in the worker's own sandbox
    assert cmd[cmd.index("--budget-s") + 1] == "5"
    shared = tmp_path / "shared" / "c.json"
    shared.parent.mkdir()
    shared.write_text('{"k": 1}')
    settings = WorkerSettings(worker_decision_cache=shared, worker_tune_threads=1)
    tuned = Worker(settings, "cpu", HARDWARE, ServiceClient("http://x", None))
    cmd = tuned.command(job, tmp_path / "m.pt2", tmp_path / "out", tmp_path)
    # The job reads a snapshot of the shared store, bound read-only, and records elsewhere.
    snapshot = Path(cmd[cmd.index("--cache") + 1])
    assert snapshot.parent == tmp_path / "cache" and snapshot.read_text() == '{"k": 1}'
    assert cmd[cmd.index("--cache-out") + 1] == str(tmp_path / "out" / "cache")
    sandbox = tuned.sandbox(job, tmp_path)
    assert sandbox.writable == () and sandbox.read_only == (tmp_path / "cache",)
    assert cmd[cmd.index("--threads") + 1] == "1"


def test_the_tune_command_carries_the_jobs_sizes(tmp_path: Path) -> None:
    """A job's sizes for dynamic dims reach `fxtune tune --sizes` (one option per dim)."""
    job = Assignment(1, 1, "cpu", None, "token", 30.0, "0" * 64, 1, "m", "/file")
    worker = Worker(WorkerSettings(), "cpu", HARDWARE, ServiceClient("http://x", None))
    assert "--sizes" not in worker.command(job, tmp_path / "m.pt2", tmp_path, tmp_path)
    sized = dataclasses.replace(job, sizes={"batch": [1, 32, 512], "seq": [128]})
    cmd = worker.command(sized, tmp_path / "m.pt2", tmp_path, tmp_path)
    given = [cmd[i + 1] for i, arg in enumerate(cmd) if arg == "--sizes"]
    assert given == ["batch=1,32,512", "seq=128"]


def test_the_tune_command_carries_a_training_jobs_mode_and_optimizer(tmp_path: Path) -> None:
    job = Assignment(1, 1, "cpu", None, "token", 30.0, "0" * 64, 1, "m", "/file")
    worker = Worker(WorkerSettings(), "cpu", HARDWARE, ServiceClient("http://x", None))
    plain = worker.command(job, tmp_path / "m.pt2", tmp_path, tmp_path)
    assert "--mode" not in plain and "--optimizer" not in plain
    train = dataclasses.replace(job, mode="train")
    cmd = worker.command(train, tmp_path / "m.pt2", tmp_path, tmp_path)
    assert cmd[cmd.index("--mode") + 1] == "train" and "--optimizer" not in cmd
    cmd = worker.command(
        dataclasses.replace(train, optimizer="adamw"), tmp_path / "m", tmp_path, tmp_path
    )
    assert cmd[cmd.index("--optimizer") + 1] == "adamw"


def test_a_distributed_job_runs_the_ranks_and_uploads_every_ranks_program(
    tmp_path: Path,
) -> None:
    """`--world-size N` with {rank} patterns; the upload names rank r's program per field."""
    job = Assignment(1, 1, "cpu", 8.0, "token", 30.0, "0" * 64, 1, "m", "/file", world_size=2)
    worker = Worker(
        WorkerSettings(worker_ranks=2), "cpu", HARDWARE, ServiceClient("http://x", None)
    )
    cmd = worker.command(job, tmp_path / "input_rank{rank}.pt2", tmp_path, tmp_path)
    assert cmd[cmd.index("--world-size") + 1] == "2"
    assert cmd[cmd.index("--out") + 1] == str(tmp_path / "tuned_rank{rank}.pt2")
    (tmp_path / "report.json").write_text("{}")
    (tmp_path / "tuned_rank0.pt2").write_bytes(b"0")
    with pytest.raises(ValueError, match="program_rank1"):
        rank_result_files(tmp_path, 2)
    (tmp_path / "tuned_rank1.pt2").write_bytes(b"1")
    files = rank_result_files(tmp_path, 2)
    assert files == {
        "report": tmp_path / "report.json",
        "program": tmp_path / "tuned_rank0.pt2",
        "program_rank1": tmp_path / "tuned_rank1.pt2",
    }


@pytest.mark.parametrize(
    ("result", "retry"),
    [
        (ChildResult(ExitCode.INTERNAL, "bug"), True),
        (ChildResult(ExitCode.USER_INPUT, "bad model"), False),
        (ChildResult(ExitCode.REFUSED, "unsafe archive"), False),
        (ChildResult(-signal.SIGKILL, "killed"), True),
        (ChildResult(-signal.SIGTERM, "stopped"), True),
        (ChildResult(ExitCode.USER_INPUT, None, timed_out=True), True),
        (ChildResult(ExitCode.REFUSED, None, cancelled=True), True),
    ],
)
def test_which_exit_codes_are_retried(result: ChildResult, retry: bool) -> None:
    assert _retryable(result) is retry


def test_a_refused_artifact_is_not_retried(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = server
    model = submit(url, program)
    make_worker(url, "exit_3", monkeypatch).run(once=True)
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "failed" and job["attempts"] == 1


def test_a_missing_device_hands_the_job_back_and_stops_the_worker(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 4: every later job would fail the same way on this worker, burning its attempts."""
    url, _ = server
    model = submit(url, program)
    worker = make_worker(url, "exit_4", monkeypatch)
    worker.run(once=True)
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "queued" and job["attempts"] == 1
    assert worker.device_lost == "error: exiting exit_4"
    assert worker.id in job["error"]
    assert worker.run() == 0  # stopped: claims nothing more, even without --once


def test_a_worker_without_its_device_exits_4(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from worker.cli import app

    monkeypatch.setenv("PYTHONPATH", str(REPO))
    absent = f"cuda:{torch.cuda.device_count()}"
    result = CliRunner().invoke(app, ["--device", absent, "--server", "http://127.0.0.1:9"])
    assert result.exit_code == ExitCode.DEVICE, result.output
    assert "not available" in result.output


class SlowToComplete(RecordingClient):
    """A result the service takes longer than the lease to accept (it checks results), with
    the service's reaper running just before it answers."""

    def __init__(self, *args: Any, reap: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reap = reap

    def complete(
        self, job: Assignment, files: dict[str, Path], run_s: float | None = None
    ) -> dict[str, Any]:
        time.sleep(job.lease_s + 1)
        self.reap(utcnow())
        return super().complete(job, files, run_s)


def test_the_lease_is_kept_while_the_result_is_being_accepted(
    server: tuple[str, Any], program: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, app = server
    model = submit(url, program)
    worker = make_worker(url, "ok", monkeypatch)
    worker.client = SlowToComplete(url, None, reap=app.state.store.requeue_expired)
    assert worker.run(once=True) == 1
    job = job_of(url, model["job"]["id"])
    assert job["status"] == "succeeded" and job["attempts"] == 1, job
    assert any(m == "uploading the result" for _, m in worker.client.beats)  # type: ignore[attr-defined]


class AnswersComplete(ServiceClient):
    """The service's answer to the result, and what the worker then reports."""

    def __init__(self, status: int) -> None:
        super().__init__("http://x", None)
        self.status = status
        self.failed: list[tuple[str, bool]] = []

    def complete(
        self, job: Assignment, files: dict[str, Path], run_s: float | None = None
    ) -> dict[str, Any]:
        request = httpx.Request("POST", f"http://x/api/v1/jobs/{job.job_id}/complete")
        _raise_for(httpx.Response(self.status, json={"detail": "why"}, request=request))
        return {}

    def fail(
        self, job: Assignment, error: str, retryable: bool, run_s: float | None = None
    ) -> dict[str, Any]:
        self.failed.append((error, retryable))
        return {}


@pytest.mark.parametrize(("status", "retry"), [(500, True), (503, True), (422, False)])
def test_a_result_the_service_failed_to_check_is_retried(status: int, retry: bool) -> None:
    """A 5xx is the service's fault (its check of the result failed): another attempt may pass;
    a 422 is a verdict on the result."""
    job = Assignment(1, 1, "cpu", None, "token", 30.0, "0" * 64, 1, "m", "/file")
    client = AnswersComplete(status)
    worker = Worker(WorkerSettings(), "cpu", HARDWARE, client)
    assert worker._complete(job, {}).status == "failed"
    ((error, retryable),) = client.failed
    assert retryable is retry and f"{status} why" in error


def test_a_stopped_job_says_where_its_tuner_was_when_it_overran() -> None:
    """A worker stopped mid-job reports its own reason, plus the tuner's stack dump when it had
    overrun its budget (`ChildResult.stacks`), and only that reason when it had not."""
    from worker.loop import _error

    stuck = ChildResult(-9, "tuning was cancelled; ...", cancelled=True, stacks='File "a.py" < b')
    assert _error(stuck) == (
        "the worker was stopped before the job finished; where it was when it overran its "
        'budget: File "a.py" < b'
    )
    plain = ChildResult(-9, "tuning was cancelled", cancelled=True)
    assert _error(plain) == "the worker was stopped before the job finished"
