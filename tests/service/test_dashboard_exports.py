"""The CSV exports read back with pandas to exactly the API's JSON."""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fastapi.testclient import TestClient

from service.core.config import Settings
from service.main import create_app
from tests.service.dashboard_pages import ELSEWHERE, LOOPBACK, TOKEN, seed
from tests.service.helpers import LOCAL, RESULTS_UNCHECKED
from tests.service.in_process_checks import in_process_checks


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict]]:
    root = tmp_path_factory.mktemp("exports")
    settings = Settings(
        data_dir=root / "data",
        database_url=f"sqlite:///{root / 'db.sqlite'}",
        api_token=TOKEN,
        worker_token="worker-" + TOKEN,
        **RESULTS_UNCHECKED,
    )
    with TestClient(
        create_app(settings, checks=in_process_checks), base_url=LOCAL, client=LOOPBACK
    ) as client:
        client.headers["Authorization"] = f"Bearer {TOKEN}"
        worker = {"Authorization": f"Bearer worker-{TOKEN}"}
        yield client, seed(client, root, worker)


@pytest.fixture
def client(served: tuple[TestClient, dict]) -> TestClient:
    return served[0]


@pytest.fixture
def ids(served: tuple[TestClient, dict]) -> dict[str, int]:
    return served[1]


def read_csv(resp: Any) -> pd.DataFrame:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "text/csv; charset=utf-8"
    assert resp.headers["content-disposition"].startswith("attachment; filename=")
    return pd.read_csv(io.StringIO(resp.text), keep_default_na=False, na_values=[""])


def same(csv_value: Any, api_value: Any) -> bool:
    """NaN in the CSV stands for null in the JSON; floats must round-trip exactly."""
    if api_value is None:
        return isinstance(csv_value, float) and math.isnan(csv_value)
    return csv_value == api_value


def test_models_csv_has_a_row_per_tuned_config_with_the_apis_figures(
    client: TestClient, ids: dict[str, int]
) -> None:
    frame = read_csv(client.get("/api/v1/exports/models.csv"))
    assert len(frame) == 3 and ids["new"] not in set(frame["model_id"])
    api_models = {m["id"]: m for m in client.get("/api/v1/models").json()}
    for row in frame.to_dict("records"):
        cfg = client.get(
            f"/api/v1/models/{row['model_id']}/config",
            params={"device": row["device"], "hardware": row["hardware_key"]},
        ).json()
        whole = cfg["whole_model"]
        ci = whole.get("ci") or [None, None]
        assert row["model"] == api_models[row["model_id"]]["name"]
        assert row["backend"] == cfg["backend"] and row["chosen"] == whole["name"]
        assert row["verdict"] == whole["verdict"]
        for column, value in (
            ("speedup", whole.get("speedup")),
            ("ci_low", ci[0]),
            ("ci_high", ci[1]),
            ("baseline_s", whole.get("baseline_s")),
            ("candidate_s", whole.get("candidate_s")),
        ):
            assert same(row[column], value), (column, row[column], value)
        assert row["threads"] == cfg["hardware"]["threads"]
        assert row["fingerprint"] == cfg["model_fingerprint"]
        assert row["sites"] == len(cfg["sites"])
        assert row["sites_accepted"] == sum(s["accepted"] for s in cfg["sites"])
        assert bool(row["original_kept"]) == (whole["name"] == "original")


def test_sites_csv_lists_every_decision_by_time_saved(
    client: TestClient, ids: dict[str, int]
) -> None:
    model = ids["resnet"]
    hardware = "cpu|test cpu|torch2.13.0|t1"
    params = {"device": "cpu", "hardware": hardware}
    frame = read_csv(client.get(f"/api/v1/models/{model}/sites.csv", params=params))
    cfg = client.get(f"/api/v1/models/{model}/config", params=params).json()
    sites = {s["site_id"]: s for s in cfg["sites"]}
    assert list(frame["site_id"]) == ["s2", "s1", "s3", "s4"]
    assert set(frame["hardware_key"]) == {hardware} and set(frame["model_id"]) == {model}
    for row in frame.to_dict("records"):
        s = sites[row["site_id"]]
        ci = s.get("ci") or [None, None]
        assert row["pass"] == s["pass"] and row["summary"] == s["summary"]
        assert row["count"] == s["count"] and bool(row["accepted"]) == s["accepted"]
        assert row["verdict"] == s["verdict"]
        for column, value in (
            ("baseline_s", s["baseline_s"]),
            ("candidate_s", s["candidate_s"]),
            ("speedup", s["speedup"]),
            ("ci_low", ci[0]),
            ("ci_high", ci[1]),
        ):
            assert same(row[column], value), (column, row[column], value)
        if s["baseline_s"] is None:
            assert math.isnan(row["time_saved_s"])
        else:
            saved = (s["baseline_s"] - s["candidate_s"]) * s["count"]
            assert row["time_saved_s"] == pytest.approx(saved, rel=1e-12)
    assert frame.loc[frame["site_id"] == "s4", "reason"].item() == "the budget ran out"


def test_sites_csv_defaults_to_the_newest_config(client: TestClient, ids: dict[str, int]) -> None:
    frame = read_csv(client.get(f"/api/v1/models/{ids['resnet']}/sites.csv"))
    assert set(frame["hardware_key"]) == {"cpu|test cpu|torch2.13.0|t4"}


def test_sites_csv_errors(client: TestClient, ids: dict[str, int]) -> None:
    assert client.get("/api/v1/models/9999/sites.csv").status_code == 404
    untuned = client.get(f"/api/v1/models/{ids['new']}/sites.csv")
    assert untuned.status_code == 404 and "detail" in untuned.json()
    wrong = client.get(f"/api/v1/models/{ids['resnet']}/sites.csv", params={"device": "tpu"})
    assert wrong.status_code == 422


def test_exports_need_the_token_off_loopback(served: tuple[TestClient, dict]) -> None:
    remote = TestClient(
        served[0].app, base_url=LOCAL, client=ELSEWHERE
    )  # shares the running app's state
    assert remote.get("/api/v1/exports/models.csv").status_code == 401
    ok = remote.get("/api/v1/exports/models.csv", headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200


def test_exports_are_in_the_openapi_schema(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert "/api/v1/exports/models.csv" in paths
    assert "/api/v1/models/{model_id}/sites.csv" in paths
    assert "/" not in paths and "/models/{model_id}" not in paths


def test_an_empty_service_exports_a_header_only(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'd.db'}")
    with TestClient(
        create_app(settings, checks=in_process_checks), base_url=LOCAL, client=LOOPBACK
    ) as client:
        frame = read_csv(client.get("/api/v1/exports/models.csv"))
        assert frame.empty and "speedup" in frame.columns
