"""The dashboard in real headless Chromium (Debian's, driven by Playwright; no browser download).

A real `fxtune serve --embedded-worker` tunes a tiny model uploaded through the page's form; the
page follows the job live, then shows the chart and the per-site table with the numbers of
`GET /api/v1/models/{id}/report`, and its download links serve the real files.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from examples.screenshots import CHROMIUM_ARGS, chromium_path
from service.launch import serve_process
from tests.service.helpers import fxtune_env, tiny_program

pytestmark = pytest.mark.e2e

TUNE = json.dumps([sys.executable, "-m", "fxtune_cli", "tune", "--backend", "eager"])
TOKEN = "browser-s3cret"
# Not about the warm checkers: each check starts its own child, instead of one more sandboxed
# Python importing torch started ahead per service and left waiting. An upload's check then
# starts with the upload, so the waits for its answer allow more than Playwright's 30 s.
COLD_CHECKS = "0"
UPLOADED_MS = 120_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium: install Debian's (apt-get install chromium); .ci/run does")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


class Tab:
    """A page that fails the test on any script error or console error (CSP included)."""

    def __init__(self, browser: Any) -> None:
        self.context = browser.new_context(accept_downloads=True)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on(
            "console",
            lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None,
        )

    def close(self) -> None:
        self.context.close()
        assert not self.errors, self.errors


@pytest.fixture
def tab(browser: Any) -> Iterator[Tab]:
    t = Tab(browser)
    yield t
    t.close()


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    path = tmp_path_factory.mktemp("browser") / "tiny.pt2"
    module, _ = tiny_program(path)
    return path, module


def watch_job_statuses(page: Any) -> None:
    """Record every status a job row shows, to prove the page updated without a reload."""
    page.evaluate(
        """() => {
        window.__statuses = [];
        new MutationObserver((records) => {
          for (const r of records) window.__statuses.push(r.target.dataset.status);
        }).observe(document.body, {subtree: true, attributes: true,
                                   attributeFilter: ["data-status"]});
      }"""
    )


def upload_through_form(page: Any, path: Path, name: str) -> None:
    page.set_input_files("#upload-form input[name=file]", str(path))
    page.fill("#upload-form input[name=name]", name)
    page.select_option("#upload-form select[name=device]", "cpu")
    # The budget counts loading and checking the upload (seconds under load): 15 s leaves the
    # tiny model's sites time to be measured.
    page.fill("#upload-form input[name=budget_s]", "15")
    page.click("#upload-form button[type=submit]")


def chart_data(page: Any, canvas_id: str) -> dict[str, Any]:
    return page.evaluate(
        """(id) => {
        const chart = Chart.getChart(document.getElementById(id));
        return {labels: chart.data.labels,
                datasets: chart.data.datasets.map(d => ({label: d.label, data: d.data}))};
      }""",
        canvas_id,
    )


def cell_values(page: Any, selector: str) -> list[float | None]:
    return page.eval_on_selector_all(
        selector,
        "cells => cells.map(c => c.dataset.value === undefined ? null : Number(c.dataset.value))",
    )


@pytest.mark.slow
def test_upload_follow_and_inspect_in_chromium(
    browser: Any, tab: Tab, program: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_WORKER_TUNE_COMMAND=TUNE,
        FXTUNE_TUNE_CACHE=str(tmp_path / "decisions.json"),  # measure for real, not from ~/.cache
        FXTUNE_WARM_CHECKERS=COLD_CHECKS,
    )
    page = tab.page
    with serve_process(env, tmp_path / "serve.log", "--embedded-worker") as url:
        page.goto(url + "/")
        assert "No tuned models yet" in page.inner_text("main")
        watch_job_statuses(page)
        upload_through_form(page, program[0], "tiny-browser")
        page.wait_for_selector("#upload-result:has-text('job #')", timeout=UPLOADED_MS)
        row = page.locator("#jobs-table tr[data-job-id]").first
        row.locator(".badge.succeeded").wait_for(timeout=120_000)
        assert row.get_attribute("data-status") == "succeeded"
        assert "running" in page.evaluate("window.__statuses")  # live, without a reload
        assert row.locator("progress").evaluate("p => p.value") == 1

        model_id = int(row.get_attribute("data-model-id"))
        report = httpx.get(f"{url}/api/v1/models/{model_id}/report", params={"device": "cpu"})
        config = report.json()["config"]
        row.locator("a.results").click()
        page.wait_for_url(f"**/models/{model_id}?device=cpu")
        check_model_page(page, config)
        check_downloads(tab, program[1], tmp_path)
        check_training_job_form(page, url, model_id)

        page.goto(url + "/")
        whole = config["whole_model"]
        shipped = 1.0 if whole["name"] == "original" else whole["speedup"]
        chart = chart_data(page, "speedup-chart")
        assert chart["labels"] == [f"tiny-browser (#{model_id})"]
        assert chart["datasets"][0]["data"] == [shipped]
        assert cell_values(page, "#models-table td.speedup") == [whole["speedup"]]
        page.goto("about:blank")  # its polling stops before the service does


def check_model_page(page: Any, config: dict[str, Any]) -> None:
    def saved(s: dict[str, Any]) -> float:
        return (s["baseline_s"] - s["candidate_s"]) * s["count"]

    sites = sorted(config["sites"], key=lambda s: -saved(s))
    assert sites, "the tiny model has a dropout site"
    shown = page.eval_on_selector_all(
        "#sites-table tbody tr", "rows => rows.map(r => r.dataset.siteId)"
    )
    assert shown == [s["site_id"] for s in sites]
    assert cell_values(page, "#sites-table td.baseline") == [s["baseline_s"] for s in sites]
    assert cell_values(page, "#sites-table td.candidate") == [s["candidate_s"] for s in sites]
    assert cell_values(page, "#sites-table td.speedup") == [s["speedup"] for s in sites]
    whole = page.get_attribute("#whole-speedup", "data-value")  # absent where not measured
    assert (None if whole is None else float(whole)) == config["whole_model"]["speedup"]
    chosen = page.locator("#candidates-table tr.chosen")
    if config["whole_model"]["name"] == "original":  # nothing beat it: no candidate row ships
        assert chosen.count() == 0
    else:
        assert chosen.count() == 1
        assert chosen.get_attribute("data-name") == config["whole_model"]["name"]
    breakdown = chart_data(page, "breakdown-chart")
    assert breakdown["labels"] == ["baseline", "tuned"] and breakdown["datasets"]
    idle = page.inner_text("#figures-table tr[data-figure=device_idle_us] td.baseline")
    assert idle.startswith("n/a (")


def check_training_job_form(page: Any, url: str, model_id: int) -> None:
    """The tune form queues a training job with its optimizer (on a device no worker serves
    here, so it stays queued) and the jobs table says what it tunes."""
    page.select_option("#tune-form select[name=device]", "xla")
    page.select_option("#tune-form select[name=mode]", "train")
    page.select_option("#tune-form select[name=optimizer]", "sgd")
    page.click("#tune-form button[type=submit]")
    page.wait_for_selector("#tune-result:has-text('job #')")
    jobs = httpx.get(f"{url}/api/v1/jobs", params={"model_id": model_id}).json()
    queued = [j for j in jobs if j["device"] == "xla"]
    assert [(j["mode"], j["optimizer"]) for j in queued] == [("train", "sgd")]
    row = page.locator(f"#jobs-table tr[data-job-id='{queued[0]['id']}']")
    assert "xla · training (sgd)" in row.inner_text()


def check_downloads(tab: Tab, module: torch.nn.Module, tmp_path: Path) -> None:
    page = tab.page
    hrefs = page.eval_on_selector_all("#downloads a[data-api]", "links => links.map(a => a.href)")
    expected = {"/config?": "application/json", "/artifact?": "application/octet-stream"}
    expected |= {"kind=baseline": "application/json", "/sites.csv?": "text/csv"}
    for needle, media in expected.items():
        href = next(h for h in hrefs if needle in h)
        resp = tab.context.request.get(href)
        assert resp.status == 200 and resp.headers["content-type"].startswith(media), href
    # The tuned program, downloaded by the browser itself, loads with plain torch.
    with page.expect_download() as download:
        page.click("#downloads a:has-text('tuned program')")
    saved = tmp_path / "tuned-from-browser.pt2"
    download.value.save_as(saved)
    tuned = torch.export.load(saved).module()
    x = torch.randn(2, 8)
    torch.testing.assert_close(tuned(x), module(x))


def test_sign_in_then_upload_with_the_token_typed_into_the_form(
    tab: Tab, program: tuple[Path, torch.nn.Module], tmp_path: Path
) -> None:
    """With a token, the dashboard asks for a sign-in from loopback too. The session cookie it
    gets is HttpOnly and SameSite=Strict, nothing of the token lands where a page script can
    read it, the page's own reads (job polling) work through the cookie, and the upload form
    sends the token typed into it, once."""
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_API_TOKEN=TOKEN,
        FXTUNE_WARM_CHECKERS=COLD_CHECKS,
    )
    page = tab.page
    with serve_process(env, tmp_path / "serve.log") as url:
        first = page.goto(url + "/models/1?device=cpu")
        assert first is not None and first.status == 401
        assert page.locator("#login-form").is_visible()
        page.fill("#login-token", "a wrong guess")
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#login-detail:has-text('invalid API token')")
        tab.errors.clear()  # the browser logs the refused page loads itself

        page.fill("#login-token", TOKEN)
        page.click("#login-form button[type=submit]")
        page.wait_for_url(f"{url}/models/1?device=cpu")  # back where it was going (a 404 page)
        page.goto(url + "/")
        tab.errors.clear()  # and the 404
        assert page.locator("#quota-table tr[data-quota=active_jobs]").count() == 1
        (cookie,) = tab.context.cookies()
        assert cookie["name"] == "fxtune_session" and TOKEN not in cookie["value"]
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        assert page.evaluate("document.cookie") == ""
        stored = "JSON.stringify([{...sessionStorage}, {...localStorage}])"
        assert page.evaluate(stored) == "[{},{}]"
        assert TOKEN not in page.content()

        page.fill("#upload-form input[name=api_token]", TOKEN)
        upload_through_form(page, program[0], "with-token")
        page.wait_for_selector("#upload-result:has-text('job #')", timeout=UPLOADED_MS)
        assert page.input_value("#upload-form input[name=api_token]") == ""
        assert page.evaluate(stored) == "[{},{}]"
        jobs = httpx.get(f"{url}/api/v1/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        assert [j["status"] for j in jobs.json()] == ["queued"]
        row = page.locator("#jobs-table tr[data-job-id]")
        assert row.count() == 1
        page.wait_for_timeout(2500)  # two polls of the job, through the cookie
        assert "cannot follow job" not in row.inner_text()
        assert httpx.get(f"{url}/api/v1/jobs").status_code == 401  # not without it

        page.click("#logout-form button[type=submit]")
        page.wait_for_url(f"{url}/login")
        assert tab.context.cookies() == []
        again = page.goto(url + "/")
        assert again is not None and again.status == 401
        tab.errors.clear()
        page.goto("about:blank")  # its polling stops before the service does
