"""A 2-rank job of the sharded example through a live service: both ranks' programs uploaded
over HTTP, refused by a 1-rank worker's claim, tuned for real (gloo, in the sandbox) by a 2-rank
worker; every rank's model gets its config and tuned program, the report and the dashboard show
the per-rank figures."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from service.cli import app as service_cli
from service.core.config import Settings
from tests.service.fakes import HARDWARE
from tests.service.helpers import REPO, thread_server
from tuner.distributed.tune import rank_path
from tuner.host.sandbox import bwrap_works
from tuner.loading.load import load_program
from worker.client import ServiceClient
from worker.config import WorkerSettings
from worker.loop import Worker

API = "/api/v1"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, Any]]:
    settings = Settings(
        data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}"
    )
    with thread_server(settings) as live:
        yield live


def worker(url: str, tmp_path: Path, ranks: int) -> Worker:
    settings = WorkerSettings(
        server=url,
        worker_poll_s=0.1,
        worker_ranks=ranks,
        worker_tune_threads=1,
        worker_sandbox="bwrap" if bwrap_works() else "none",
        worker_scratch_dir=tmp_path / "scratch",
        worker_decision_cache=tmp_path / "cache" / "decisions.json",
    )
    return Worker(settings, "cpu", HARDWARE, ServiceClient(url, None))


@pytest.mark.slow
def test_a_two_rank_job_is_tuned_by_a_two_rank_worker_and_shown_per_rank(
    server: tuple[str, Any], sharded_2: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _app = server
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    pattern = sharded_2
    submit = ["submit", pattern, "--server", url, "--world-size", "2", "--budget-s", "8"]
    submitted = CliRunner().invoke(service_cli, submit)
    assert submitted.exit_code == 0, submitted.output
    models = httpx.get(f"{url}{API}/models").json()
    ranks = sorted(m["id"] for m in models)
    assert [m["name"] for m in sorted(models, key=lambda m: m["id"])] == [
        rank_path("sharded_rank{rank}", r).name for r in range(2)
    ]
    (queued,) = httpx.get(f"{url}{API}/jobs").json()
    assert f"job {queued['id']}: queued" in submitted.output
    jobs = f"{url}{API}/models/{ranks[0]}/jobs"
    body = {"device": "cpu", "budget_s": 8, "world_size": 2}
    refused = [
        httpx.post(jobs, json=body | {"rank_models": [ranks[0], ranks[0]]}),  # one upload twice
        httpx.post(jobs, json=body | {"rank_models": ranks[::-1]}),  # rank 0 is not the path's
        httpx.post(jobs, json=body),  # no programs named
    ]
    assert [r.status_code for r in refused] == [422, 422, 422], [r.text for r in refused]
    job = httpx.post(jobs, json=body | {"rank_models": ranks})  # the same job again
    assert job.status_code == 202 and job.json()["id"] == queued["id"], job.text
    assert job.json()["world_size"] == 2 and job.json()["rank_models"] == ranks

    assert worker(url, tmp_path, ranks=1).run(once=True) == 0  # never handed to 1 rank
    assert worker(url, tmp_path, ranks=2).run(once=True) == 1
    done = httpx.get(f"{url}{API}/jobs/{job.json()['id']}").json()
    assert done["status"] == "succeeded", done

    report = httpx.get(f"{url}{API}/models/{ranks[1]}/report?device=cpu").json()
    assert report["report_version"] == 1 and report["world_size"] == 2
    assert len(report["overlap_profile"]["per_rank"]) == 2
    assert all(len(s["per_rank"]) == 2 for s in report["sites"] if "comparison" in s)
    assert report["artifacts"]["program"].startswith(f"{API}/models/{ranks[1]}/artifact")
    section = report["config"]["distributed"]
    assert section["world_size"] == 2 and section["rank"] == 1
    profile = section["overlap_profile"]
    assert len(profile["per_rank"]) == 2 and profile["slowest_rank"]["sequential_step_us"] > 0
    (site,) = report["config"]["sites"]
    assert len(section["sites_per_rank"][site["site_id"]]) == 2
    programs = []
    for rank, model_id in enumerate(ranks):
        config = httpx.get(f"{url}{API}/models/{model_id}/config?device=cpu").json()
        assert config["distributed"]["rank"] == rank
        assert [s["accepted"] for s in config["sites"]] == [site["accepted"]]  # one decision
        artifact = httpx.get(f"{url}{API}/models/{model_id}/artifact?device=cpu")
        assert artifact.status_code == 200
        path = tmp_path / f"tuned{rank}.pt2"
        path.write_bytes(artifact.content)
        load_program(path).module()  # each rank's own tuned program (its own tables)
        programs.append(artifact.content)
    assert programs[0] != programs[1]

    index = httpx.get(f"{url}/")
    assert index.status_code == 200 and all(f"/models/{i}" in index.text for i in ranks)
    page = httpx.get(f"{url}/models/{ranks[1]}?device=cpu")
    assert page.status_code == 200
    html = page.text
    assert 'id="ranks-table"' in html and "this is rank 1's program" in html
    for rank in ("slowest", "0", "1"):
        assert f'data-rank="{rank}"' in html
    seq = profile["per_rank"][1]["sequential_step_us"]
    assert f'data-value="{seq}"' in html  # rank 1's own figure, as stored
