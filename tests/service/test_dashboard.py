"""The dashboard's pages in-process (TestClient): every number shown is the API's number.

The seeded service (tests/service/dashboard_pages.py) stores results the way a worker stores
them, with a config that has accepted, rejected and unmeasured sites, several whole-model
candidates and profiles with figures the profiler could not take.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.identity import SESSION_COOKIE
from service.core.config import Settings
from service.dashboard import format as fmt
from service.main import create_app
from tests.service.dashboard_pages import (
    ELSEWHERE,
    LOOPBACK,
    PROFILES,
    TOKEN,
    Page,
    page,
    report,
    rich_config,
    seed,
    store_result,
    upload,
)
from tests.service.fakes import training_config
from tests.service.helpers import LOCAL, RESULTS_UNCHECKED, tiny_program
from tests.service.in_process_checks import in_process_checks


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict]]:
    """One seeded service shared by the read-only tests of this module."""
    root = tmp_path_factory.mktemp("dashboard")
    settings = Settings(
        data_dir=root / "data", database_url=f"sqlite:///{root / 'db.sqlite'}", **RESULTS_UNCHECKED
    )
    with TestClient(
        create_app(settings, checks=in_process_checks), base_url=LOCAL, client=LOOPBACK
    ) as client:
        yield client, seed(client, root)


@pytest.fixture
def client(served: tuple[TestClient, dict]) -> TestClient:
    return served[0]


@pytest.fixture
def ids(served: tuple[TestClient, dict]) -> dict[str, int]:
    return served[1]


def test_index_shows_every_tuned_config_with_the_apis_speedup(
    client: TestClient, ids: dict[str, int]
) -> None:
    index = page(client, "/")
    rows = index.tables["models-table"]
    tuned = [r for r in rows if "data-hardware" in r.attrs]
    assert len(tuned) == 3  # resnet on two CPUs, bert once
    for row in tuned:
        model_id = int(row.attrs["data-model-id"])
        whole = report(client, model_id, hardware=row.attrs["data-hardware"])["config"]
        whole = whole["whole_model"]
        speedup = next(c for c in row.cells if "speedup" in c.classes)
        assert speedup.value == whole.get("speedup")
        assert speedup.text == fmt.speedup(whole.get("speedup"))
        assert fmt.interval(whole.get("ci")) in [c.text for c in row.cells]
    bert = next(r for r in tuned if r.attrs["data-model-id"] == str(ids["bert"]))
    assert "original kept" in [c.text for c in bert.cells]
    assert "n/a" in [c.text for c in bert.cells]
    new = next(r for r in rows if r.attrs["data-model-id"] == str(ids["new"]))
    assert "not tuned yet" in new.text(1)


def test_index_chart_plots_what_ships(client: TestClient, ids: dict[str, int]) -> None:
    chart = page(client, "/").json["speedup-data"]
    assert chart["labels"] == [f"bert (#{ids['bert']})", f"resnet (#{ids['resnet']})"]
    assert len(chart["datasets"]) == 2  # two hardware keys (1 and 4 threads)
    one, four = sorted(chart["datasets"], key=lambda d: d["label"])
    assert one["label"].endswith("1 threads") and four["label"].endswith("4 threads")
    assert one["data"] == [1.0, 1.8]  # bert kept its original: 1x by definition
    assert one["verdict"][0] == "original kept"
    assert four["data"] == [None, 1.8]
    assert one["ci"][1] == fmt.interval([1.7, 1.9])


def test_site_table_is_sorted_by_time_saved_with_the_reports_numbers(
    client: TestClient, ids: dict[str, int]
) -> None:
    view = page(client, f"/models/{ids['resnet']}?device=cpu")
    rows = view.tables["sites-table"]
    sites = {s["site_id"]: s for s in report(client, ids["resnet"])["config"]["sites"]}
    assert [r.attrs["data-site-id"] for r in rows] == ["s2", "s1", "s3", "s4"]
    for row in rows:
        s = sites[row.attrs["data-site-id"]]
        cells = {c: next(x for x in row.cells if c in x.classes) for c in ("baseline", "speedup")}
        assert cells["baseline"].value == s["baseline_s"]
        assert cells["baseline"].text == fmt.duration_s(s["baseline_s"])
        assert cells["speedup"].value == s["speedup"]
        assert fmt.interval(s["ci"]) in [c.text for c in row.cells]
        saved = next(x for x in row.cells if "saved" in x.classes)
        if s["baseline_s"] is None:
            assert saved.value is None and saved.text == "n/a"
        else:
            want = (s["baseline_s"] - s["candidate_s"]) * s["count"]
            assert saved.value == pytest.approx(want, rel=1e-12)
        assert row.attrs["class"] == ("accepted" if s["accepted"] else "rejected")
    assert "the budget ran out" in rows[3].text(8)
    assert rows[0].cells[2].text == "4"  # count


def test_model_page_shows_the_sizes_measured_and_speedup_per_size(
    client: TestClient, ids: dict[str, int]
) -> None:
    view = page(client, f"/models/{ids['resnet']}")
    rows = view.tables["sizes-table"]
    assert [r.attrs["data-size"] for r in rows] == ["batch=32", "batch=2", "batch=512"]
    assert [r.cells[4].value for r in rows] == [1.8, 2.5, 1.01]
    assert all(r.attrs.get("class") == "chosen" for r in rows)
    assert rows[1].cells[5].text == "[2.40, 2.60]"
    html = client.get(f"/models/{ids['resnet']}").text
    assert "batch in [2, 4096]" in html and "batch=1: outside" in html


def test_candidates_table_marks_the_chosen_one(client: TestClient, ids: dict[str, int]) -> None:
    rows = page(client, f"/models/{ids['resnet']}").tables["candidates-table"]
    assert [r.attrs["data-name"] for r in rows] == [
        "eager + tuned passes",
        "inductor",
        "inductor + tuned passes",
    ]
    assert [r.attrs.get("class") for r in rows] == ["chosen", None, None]
    assert rows[2].cells[6].text == "(open, 1.10]"  # an open bound is not a zero
    kept = page(client, f"/models/{ids['bert']}")
    assert not any(r.attrs.get("class") == "chosen" for r in kept.tables["candidates-table"])


def test_profile_breakdown_matches_the_report_and_never_shows_zero_for_missing(
    client: TestClient, ids: dict[str, int]
) -> None:
    view = page(client, f"/models/{ids['resnet']}")
    profiles = report(client, ids["resnet"])["profiles"]
    figures = {r.attrs["data-figure"]: r for r in view.tables["figures-table"]}
    assert figures["ops_per_iter"].cells[1].value == profiles["baseline"]["ops_per_iter"]
    assert figures["ops_per_iter"].cells[2].value == profiles["tuned"]["ops_per_iter"]
    assert figures["ops_per_iter"].cells[3].text == "-25%"
    idle = figures["device_idle_us"].cells[1]
    assert idle.value is None and idle.text == (
        "n/a (on CPU the host runs the kernels; there is no device to idle)"
    )
    assert figures["kernels_per_iter"].cells[2].text == "n/a (not recorded)"
    categories = {r.attrs["data-category"]: r for r in view.tables["categories-table"]}
    assert set(categories) == {"matmul_conv", "pointwise", "collective"}
    for name, row in categories.items():
        assert row.cells[1].value == profiles["baseline"]["time_by_category_us"][name]
        assert row.cells[2].value == profiles["tuned"]["time_by_category_us"][name]
    chart = view.json["breakdown-data"]
    stacked = {d["label"]: d["data"] for d in chart["datasets"]}
    assert stacked["matmul_conv"] == [60.0, 40.0]
    assert stacked["host overhead (outside ops)"] == [200.0, 90.0]
    assert "collective" not in stacked  # measured zero in both: no empty segment


def test_a_report_without_profiles_says_so(client: TestClient, ids: dict[str, int]) -> None:
    html = client.get(f"/models/{ids['bert']}").text
    assert "n/a (this report has no profiles" in html
    assert "figures-table" not in html


def test_every_download_link_resolves(client: TestClient, ids: dict[str, int]) -> None:
    view = page(client, f"/models/{ids['resnet']}?device=cpu")
    links = [a["href"] for a in view.links if "data-api" in a]
    kinds = {
        "/config?": "application/json",
        "/artifact?": "application/octet-stream",
        "format=aoti": "application/octet-stream",
        "kind=baseline": "application/json",
        "kind=tuned": "application/json",
        "/report?": "application/json",
        "/sites.csv?": "text/csv",
        "/file": "application/octet-stream",
        "/exports/models.csv": "text/csv",
    }
    for needle, media in kinds.items():
        matching = [link for link in links if needle in link]
        assert matching, f"no link with {needle} in {links}"
        for link in matching:
            resp = client.get(link)
            assert resp.status_code == 200, (link, resp.text)
            assert resp.headers["content-type"].startswith(media), link
    assert not any("format=aoti" in a["href"] for a in page(client, f"/models/{ids['bert']}").links)


def test_config_tabs_pick_the_hardware(client: TestClient, ids: dict[str, int]) -> None:
    view = page(client, f"/models/{ids['resnet']}")
    tabs = [a for a in view.links if a["href"].startswith(f"/models/{ids['resnet']}?")]
    assert len(tabs) == 2
    newest = [a for a in tabs if a.get("aria-current") == "page"]
    assert len(newest) == 1 and "t4" in newest[0]["href"]  # the newest config by default
    other = next(a for a in tabs if "aria-current" not in a)
    chosen = page(client, other["href"])
    current = next(a for a in chosen.links if a.get("aria-current") == "page")
    assert current["href"] == other["href"]


def test_unknown_pages_are_html_404s(client: TestClient, ids: dict[str, int]) -> None:
    for url in ("/models/9999", f"/models/{ids['new']}?device=cuda"):
        resp = client.get(url)
        assert resp.status_code == 404 and resp.headers["content-type"].startswith("text/html")
        assert "Not found" in resp.text
    assert client.get("/models/abc").status_code == 422


def test_untuned_model_page_shows_its_job(client: TestClient, ids: dict[str, int]) -> None:
    view = page(client, f"/models/{ids['new']}")
    jobs = view.tables["jobs-table"]
    assert len(jobs) == 1 and jobs[0].attrs["data-status"] == "queued"
    assert "sites-table" not in view.tables


def test_pages_load_nothing_from_other_origins(client: TestClient, ids: dict[str, int]) -> None:
    for url in ("/", f"/models/{ids['resnet']}"):
        resp = client.get(url)
        assert "script-src 'self'" in resp.headers["content-security-policy"]
        assets = Page(resp.text).assets
        assert "/static/vendor/chart.umd.js" in assets
        assert all(a.startswith("/") or a.startswith("data:") for a in assets), assets
        for asset in assets:
            if asset.startswith("/"):
                assert client.get(asset).status_code == 200, asset


@pytest.fixture
def token_app(tmp_path: Path) -> Any:
    settings = Settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        api_token=TOKEN,
    )
    return create_app(settings, checks=in_process_checks)


def test_pages_need_a_sign_in_from_any_address(token_app: Any) -> None:
    """Loopback included; the session cookie the sign-in sets opens pages and the API's reads,
    never a write (tests/service/test_read_auth.py has every route)."""
    for host in (LOOPBACK, ELSEWHERE):
        with TestClient(token_app, base_url=LOCAL, client=host) as browser:
            refused = browser.get("/models/1?device=cpu")
            assert refused.status_code == 401 and 'id="login-form"' in refused.text
            assert 'name="next" value="/models/1?device=cpu"' in refused.text
            assert browser.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
            browser.cookies.set(SESSION_COOKIE, TOKEN)  # the token itself is no session
            assert browser.get("/").status_code == 401
            browser.cookies.clear()
            signed = browser.post("/login", data={"token": TOKEN}, follow_redirects=False)
            assert signed.status_code == 303 and signed.headers["location"] == "/"
            assert browser.get("/").status_code == 200
            assert browser.get("/static/dashboard.js").status_code == 200
            assert browser.get("/api/v1/models").status_code == 200
            write = browser.post("/api/v1/models", files={"file": ("x.pt2", b"zip")})
            assert write.status_code == 401


def test_without_a_token_only_loopback_sees_pages(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'd.db'}")
    with TestClient(
        create_app(settings, checks=in_process_checks), base_url=LOCAL, client=ELSEWHERE
    ) as remote:
        resp = remote.get("/")
        assert resp.status_code == 403 and "only accepts requests from loopback" in resp.text
        assert "login-form" not in resp.text


@contextmanager
def service_with_a_model(root: Path, name: str) -> Iterator[tuple[TestClient, Path, int]]:
    """A service of its own, for a test that stores results the shared one must not show:
    the client, a tiny program, and the id it was uploaded (and queued) under."""
    settings = Settings(
        data_dir=root / "data", database_url=f"sqlite:///{root / 'db.sqlite'}", **RESULTS_UNCHECKED
    )
    with TestClient(
        create_app(settings, checks=in_process_checks), base_url=LOCAL, client=LOOPBACK
    ) as client:
        program = root / "tiny.pt2"
        tiny_program(program)
        yield client, program, upload(client, program, name)["id"]


def test_model_page_shows_the_bucket_each_size_falls_in(tmp_path: Path) -> None:
    """Size buckets (winners differ by size): each size names its bucket and is marked chosen
    for the candidate its bucket runs, not for the headline's."""
    cfg = rich_config()
    cfg["buckets"] = [
        {"dim": "batch", "min": 2, "max": 101, "measured": [2, 32], "name": "eager + tuned passes",
         "backend": "eager", "passes": [], "per_size": cfg["candidates"][0]["per_size"][:2]},
        {"dim": "batch", "min": 102, "max": 4096, "measured": [512], "name": "original",
         "backend": "eager", "passes": [], "per_size": []},
    ]  # fmt: skip
    with service_with_a_model(tmp_path, "bucketed") as (client, program, model_id):
        store_result(client, program, tmp_path / "r", cfg)
        rows = page(client, f"/models/{model_id}").tables["sizes-table"]
        html = client.get(f"/models/{model_id}").text
    assert [(r.attrs["data-size"], r.text(2)) for r in rows] == [
        ("batch=32", "batch in [2, 101]: eager + tuned passes"),
        ("batch=2", "batch in [2, 101]: eager + tuned passes"),
        ("batch=512", "batch in [102, 4096]: original"),
    ]
    assert [r.attrs.get("class") for r in rows] == ["chosen", "chosen", None]
    assert "each size bucket runs the candidate that won inside it" in html


def test_training_configs_get_rows_of_their_own(tmp_path: Path) -> None:
    """Issue 12: a model tuned for inference and for a training step shows both, apart: one
    row each on the index, a tab each, and the training page's step and torch.compile figure."""
    with service_with_a_model(tmp_path, "towers") as (client, program, model_id):
        store_result(client, program, tmp_path / "i", rich_config())
        job = {"device": "cpu", "mode": "train", "optimizer": "sgd"}
        assert client.post(f"/api/v1/models/{model_id}/jobs", json=job).status_code == 202
        phases = {
            "forward": {"wall_us_per_iter": 40.0, "op_calls_per_iter": 12.0},
            "backward": {"wall_us_per_iter": 90.0, "op_calls_per_iter": 30.0},
        }
        step = {kind: {**p, "phases": phases} for kind, p in PROFILES.items()}
        step["tuned"]["phases"] = {**phases, "backward": {"wall_us_per_iter": 45.0}}
        store_result(client, program, tmp_path / "t", training_config(speedup=1.25), step)

        rows = page(client, "/").tables["models-table"]
        modes = {r.attrs["data-mode"]: r for r in rows if "data-mode" in r.attrs}
        assert set(modes) == {"infer", "train"}
        assert "training · sgd" in [c.text for c in modes["train"].cells]
        for mode, row in modes.items():
            whole = report(client, model_id, mode=mode)["config"]["whole_model"]
            assert next(c for c in row.cells if "speedup" in c.classes).value == whole["speedup"]
        labels = [d["label"] for d in page(client, "/").json["speedup-data"]["datasets"]]
        assert sorted(label.endswith("training step") for label in labels) == [False, True]

        view = page(client, f"/models/{model_id}?mode=train")
        html = client.get(f"/models/{model_id}?mode=train").text
        tabs = [a for a in view.links if a["href"].startswith(f"/models/{model_id}?")]
        current = [a for a in tabs if a.get("aria-current") == "page"]
        assert len(tabs) == 2 and len(current) == 1 and "mode=train" in current[0]["href"]
        assert "time per training step" in html and 'id="versus-compile" data-value="1.3"' in html
        assert "one sgd step" in html
        api = [a["href"] for a in view.links if a["href"].startswith("/api/v1/models/")]
        downloads = [h for h in api if "/file" not in h]
        assert downloads and all("mode=train" in h for h in downloads)
        assert all(client.get(h).status_code == 200 for h in downloads)
        jobs = view.tables["jobs-table"]
        assert "cpu · training (sgd)" in [c.text for r in jobs for c in r.cells]
        rows = {r.attrs["data-phase"]: r for r in view.tables["phases-table"]}
        assert list(rows) == [
            "forward.wall_us_per_iter",
            "forward.op_calls_per_iter",
            "backward.wall_us_per_iter",
            "backward.op_calls_per_iter",
        ]
        backward = rows["backward.wall_us_per_iter"]
        assert [c.value for c in backward.cells[1:3]] == [90.0, 45.0]
        assert backward.text(3) == "-50%"
        assert "n/a (not recorded)" in rows["backward.op_calls_per_iter"].text(2)
        infer = page(client, f"/models/{model_id}?mode=infer")
        assert "phases-table" not in infer.tables
        assert "versus-compile" not in client.get(f"/models/{model_id}?mode=infer").text
