"""End to end: `fxtune serve` and `fxtune worker` as real processes, the real tuner in the child.

Uploads go over HTTP; the tuned program comes back over HTTP and must load with plain torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from service.launch import serve_process
from tests.service.fakes import write_result
from tests.service.helpers import (
    POLL,
    REPO,
    children,
    fxtune_env,
    malicious_program,
    payload_runs_under_plain_load,
    pid_alive,
    tiny_program,
    wait_for,
    worker_process,
)
from tuner.graph.fingerprint import model_fingerprint
from tuner.loading.load import load_program

pytestmark = pytest.mark.e2e

# Only the eager backend keeps each real tuning run to seconds on a 2-core CI box.
TUNE = json.dumps([sys.executable, "-m", "fxtune_cli", "tune", "--backend", "eager"])
# None of these tests is about the warm checkers (tests/e2e/test_signals.py,
# tests/service/test_warm_checkers.py are): each check starts its own child, instead of a child
# per check plus one started ahead and left waiting (a sandboxed Python importing torch).
COLD_CHECKS = "0"


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("e2e")
    module, inputs = tiny_program(root / "tiny.pt2")
    marker = root / "PWNED"
    evil = malicious_program(root / "tiny.pt2", root / "evil.pt2", marker)
    assert payload_runs_under_plain_load(evil, marker), "the crafted archive must be malicious"
    return {
        "good": root / "tiny.pt2",
        "evil": evil,
        "marker": marker,
        "module": module,
        "inputs": inputs,
    }


def wait_job(
    url: str, job_id: int, timeout_s: float = 180, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        job = POLL.get(f"{url}/api/v1/jobs/{job_id}", headers=headers).json()
        return job if job["status"] in ("succeeded", "failed") else None

    return wait_for(finished, timeout_s, f"job {job_id} to finish", 0.5)


def upload(url: str, path: Path, **fields: str) -> httpx.Response:
    with path.open("rb") as f:
        return httpx.post(f"{url}/api/v1/models", files={"file": f}, data=fields, timeout=60)


@pytest.fixture
def env(postgres: Any, tmp_path: Path) -> dict[str, str]:
    """On PostgreSQL, the scale-out database; the other end-to-end runs of a real worker (the
    killed worker, the embedded worker, tests/e2e/test_client_e2e.py) are on SQLite."""
    return fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_DATABASE_URL=postgres.new_database(),
        FXTUNE_WORKER_TUNE_COMMAND=TUNE,
        FXTUNE_WARM_CHECKERS=COLD_CHECKS,
    )


@pytest.mark.slow
def test_upload_tune_and_fetch_over_http(
    env: dict[str, str], programs: dict[str, Any], tmp_path: Path
) -> None:
    with (
        serve_process(env, tmp_path / "serve.log") as url,
        worker_process(url, env, tmp_path / "worker.log") as worker,
    ):
        # The crafted archive: refused at upload by the safe loader, payload never ran.
        evil = upload(url, programs["evil"], tune="true", budget_s="3")
        assert evil.status_code == 422 and "cannot be loaded safely" in evil.json()["detail"]
        assert not programs["marker"].exists()
        submit = subprocess.run(
            [
                sys.executable,
                "-m",
                "fxtune_cli",
                "submit",
                str(programs["good"]),
                "--server",
                url,
                "--budget-s",
                "3",
                "--wait",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert submit.returncode == 0, submit.stdout + submit.stderr
        assert "tuned: backend eager" in submit.stdout

        assert not programs["marker"].exists()
        assert worker.poll() is None and httpx.get(f"{url}/healthz").status_code == 200

        # Same bytes again: the same model.
        again = upload(url, programs["good"])
        assert again.status_code == 200
        model_id = again.json()["id"]
        assert len(httpx.get(f"{url}/api/v1/models").json()) == 1

        # The tuned program loads with plain torch and computes what the original does.
        art = httpx.get(f"{url}/api/v1/models/{model_id}/artifact", params={"device": "cpu"})
        assert art.status_code == 200
        (tmp_path / "tuned.pt2").write_bytes(art.content)
        tuned = torch.export.load(tmp_path / "tuned.pt2").module()
        for _ in range(3):
            x = torch.randn_like(programs["inputs"][0])
            torch.testing.assert_close(tuned(x), programs["module"](x))

        # A deployment holding only the model finds its config by fingerprint, then polls cheaply.
        fingerprint = model_fingerprint(load_program(programs["good"]))
        cfg = httpx.get(f"{url}/api/v1/configs/{fingerprint}", params={"device": "cpu"})
        assert cfg.status_code == 200 and cfg.json()["model_fingerprint"] == fingerprint
        same = httpx.get(
            f"{url}/api/v1/configs/{fingerprint}", headers={"If-None-Match": cfg.headers["etag"]}
        )
        assert same.status_code == 304
        report = httpx.get(f"{url}/api/v1/models/{model_id}/report").json()
        assert report["config"] == cfg.json() and "baseline" in report["profiles"]


@pytest.mark.slow
def test_a_worker_killed_mid_job_loses_nothing(programs: dict[str, Any], tmp_path: Path) -> None:
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_LEASE_S="4",
        FXTUNE_REAP_INTERVAL_S="1",
        FXTUNE_RETRY_BACKOFF_S="0",
        FXTUNE_WORKER_TUNE_COMMAND=TUNE,
        FXTUNE_WARM_CHECKERS=COLD_CHECKS,
    )
    with serve_process(env, tmp_path / "serve.log") as url:
        job_id = upload(url, programs["good"], tune="true", budget_s="5").json()["job"]["id"]
        with worker_process(url, env, tmp_path / "doomed.log") as doomed:
            # Mid-job: leased and its tuner started. Not "progress > 0" too: on busy cores the
            # program's loading took 3.9 s of the 5 s budget, and progress rose only at the end.
            def tuning() -> list[int] | None:
                job = POLL.get(f"{url}/api/v1/jobs/{job_id}").json()
                kids = children(doomed.pid)
                return kids if job["status"] == "running" and kids else None

            tuners = wait_for(tuning, 120, "the first worker to be mid-job")
            os.kill(doomed.pid, signal.SIGKILL)
            doomed.wait()
            wait_for(lambda: not any(pid_alive(p) for p in tuners), 10, "its tuner to die too")

        def requeued() -> bool:  # by the service's own reaper: no worker is claiming now
            job = POLL.get(f"{url}/api/v1/jobs/{job_id}").json()
            return job["status"] == "queued" and "lease expired" in (job["error"] or "")

        wait_for(requeued, 30, "the reaper to requeue the job")
        with worker_process(url, env, tmp_path / "rescuer.log") as rescuer:
            job = wait_job(url, job_id)
            assert rescuer.poll() is None
        assert job["status"] == "succeeded", job
        assert job["attempts"] == 2 and job["worker_id"].split("-")[-2] == str(rescuer.pid)
        jobs = httpx.get(f"{url}/api/v1/jobs").json()
        assert [j["id"] for j in jobs] == [job_id]
        configs = httpx.get(f"{url}/api/v1/models").json()[0]["configs"]
        assert len(configs) == 1 and configs[0]["job_id"] == job_id


# One racing worker (`python -c RACER URL WORKER_ID FILES`): claim and complete with the trivial
# result in FILES (JSON: part name to path, written once by the test) until the queue is empty,
# then print the ids of the jobs it completed as a JSON list. A racer that wrote its own result
# (`write_result`) would import torch to fingerprint the program: seconds of CPU for each.
RACER = """
import json, sys
from pathlib import Path
from tests.service.fakes import HARDWARE
from worker.client import ServiceClient

client = ServiceClient(sys.argv[1], None)
files = {name: Path(path) for name, path in json.loads(sys.argv[3]).items()}
done = []
while (job := client.claim(sys.argv[2], "cpu", HARDWARE)) is not None:
    client.complete(job, files)
    done.append(job.job_id)
print(json.dumps(done))
"""


@pytest.fixture
def race_env(postgres: Any, tmp_path: Path) -> Iterator[dict[str, str]]:
    # This tests the queue, with planted models that have no upload: results go unchecked
    # (checking a result runs a child per completion; tests/service/test_forged_results.py).
    yield fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_DATABASE_URL=postgres.new_database(),
        FXTUNE_RESULT_CHECK="none",
        FXTUNE_WARM_CHECKERS=COLD_CHECKS,  # nothing is uploaded: no check at all
    )


@pytest.mark.slow
def test_four_workers_race_over_200_jobs_on_postgresql(
    race_env: dict[str, str], programs: dict[str, Any], tmp_path: Path
) -> None:
    """Claim/complete over HTTP with a trivial result: this tests the queue, not the tuner."""
    from service.db.engine import make_engine
    from service.db.migrate import upgrade_to_head
    from service.store.sqlalchemy_store import SqlAlchemyStore

    engine = make_engine(race_env["FXTUNE_DATABASE_URL"])
    upgrade_to_head(engine)
    store = SqlAlchemyStore(engine)
    queued = set()
    fingerprint = model_fingerprint(load_program(programs["good"]))  # what uploads record
    for i in range(200):
        model, _ = store.add_model(f"{i:064x}", f"m{i}", 1, fingerprint)
        queued.add(store.enqueue_job(model.id, "cpu", None)[0].id)
    engine.dispose()
    result = write_result(tmp_path / "result", programs["good"])  # names the upload's fingerprint
    files = json.dumps({name: str(path) for name, path in result.items()})

    with serve_process(race_env, tmp_path / "serve.log") as url:
        racers = [
            subprocess.Popen(
                [sys.executable, "-c", RACER, url, f"racer{i}", files],
                cwd=REPO,
                env=race_env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(4)
        ]
        claimed = [json.loads(r.communicate(timeout=240)[0]) for r in racers]
        assert all(r.returncode == 0 for r in racers)
        jobs = httpx.get(f"{url}/api/v1/jobs", params={"limit": 1000}).json()
        models = httpx.get(f"{url}/api/v1/models", params={"limit": 1000}).json()

    every = [job_id for ids in claimed for job_id in ids]
    assert len(every) == len(set(every)) == 200 and set(every) == queued
    assert sum(1 for ids in claimed if ids) >= 2, "the workers did not actually race"
    assert all(j["status"] == "succeeded" and j["attempts"] == 1 for j in jobs)
    assert len(jobs) == 200
    assert sorted(len(m["configs"]) for m in models) == [1] * 200


@pytest.mark.slow
def test_serve_with_an_embedded_worker_and_a_user_token(
    programs: dict[str, Any], tmp_path: Path
) -> None:
    """The embedded worker is a child that talks HTTP, and it stops with the service.

    With a user token and no FXTUNE_WORKER_TOKEN, the service makes up a worker token for its
    own worker: jobs still run, while the user token stays refused on the worker routes. On
    loopback without a token the embedded worker tunes in tests/e2e/test_dashboard_browser.py
    and test_installed_wheel.py, and stops with the service in tests/e2e/test_signals.py.
    """
    token = "user-s3cret"
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_WORKER_TUNE_COMMAND=json.dumps([sys.executable, "-m", "tests.worker.fake_tune"]),
        FXTUNE_WORKER_POLL_S="0.2",
        FXTUNE_WARM_CHECKERS=COLD_CHECKS,
        FXTUNE_API_TOKEN=token,
    )
    auth = {"Authorization": f"Bearer {token}"}
    with serve_process(env, tmp_path / "serve.log", "--embedded-worker") as url:
        with programs["good"].open("rb") as f:
            up = httpx.post(
                f"{url}/api/v1/models",
                files={"file": f},
                data={"tune": "true"},
                headers=auth,
                timeout=60,  # the analysis child starts beside the embedded worker's torch import
            )
        assert up.status_code == 201, up.text
        job = wait_job(url, up.json()["job"]["id"], timeout_s=120, headers=auth)
        assert job["status"] == "succeeded", job
        body = {"worker_id": "me", "device": "cpu"}
        claim = httpx.post(f"{url}/api/v1/jobs/claim", json=body, headers=auth)
        assert claim.status_code == 403
        worker_pid = int(job["worker_id"].split("-")[-2])  # worker ids are host-pid-device
        assert pid_alive(worker_pid)
    wait_for(lambda: not pid_alive(worker_pid), 30, "the embedded worker to stop with the service")
