"""Reads need the token when one is set, from any address (issue 47), on every read route.

The routes are taken from the app's own route table, so a route added later is covered without
anyone remembering to list it: each GET route outside a short list of public ones (liveness,
the API's documentation, the sign-in page, static assets) is asked without credentials from
loopback, where it used to answer 200, and must refuse with 401 (before any 404 could tell what
exists). The same request with the token, or with the session cookie the dashboard's sign-in
sets, must then read the seeded data (200), so a route that refuses everything cannot pass. A
session cookie never authorises a write.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastapi.routing
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Mount

from service.api.deps import require_writer
from service.api.identity import SESSION_COOKIE
from service.core.config import Settings
from service.main import create_app
from tests.service.dashboard_pages import seed
from tests.service.fakes import FINGERPRINT
from tests.service.helpers import LOCAL, RESULTS_UNCHECKED, tiny_program
from tests.service.in_process_checks import in_process_checks

TOKEN = "read-s3cret"
WORKER = "worker-s3cret"
LOOPBACK = ("127.0.0.1", 40000)
BEARER = {"Authorization": f"Bearer {TOKEN}"}
# Open to anyone on purpose: liveness for orchestrators, the API's schema and its pages (no
# data), the sign-in page itself. Everything else that answers GET holds data.
PUBLIC = frozenset(
    {"/healthz", "/api/v1/healthz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
    | {"/login"}
)
PUBLIC_MOUNTS = frozenset({"/static"})
# Authorised by a job's lease (X-Fxtune-Lease), not the user's token: refused without it too.
LEASED = frozenset({"/api/v1/jobs/{job_id}/program"})
# Required query parameters: a value that finds seeded data, or any well-formed one.
QUERIES = {"kind": "baseline", "sha256": "0" * 64}


def route_table(app: Any) -> list[Any]:
    """Every route with its full path, dependencies and methods: FastAPI 0.16x keeps included
    routers as nodes of `app.routes`, and `iter_route_contexts` flattens them."""
    flatten = getattr(fastapi.routing, "iter_route_contexts", None)
    return list(flatten(app.routes)) if flatten is not None else list(app.routes)


def get_routes(client: TestClient) -> list[Any]:
    routes = []
    for route in client.app_routes:  # type: ignore[attr-defined]
        original = getattr(route, "original_route", route)
        if isinstance(original, Mount):
            assert route.path in PUBLIC_MOUNTS, f"a mount nobody decided about: {route.path}"
        elif isinstance(original, APIRoute) and "GET" in route.methods and route.path not in PUBLIC:
            routes.append(route)
    return routes


def write_routes(client: TestClient) -> list[Any]:
    def needs_writer(route: Any) -> bool:
        todo = list(route.dependant.dependencies)
        while todo:
            dep = todo.pop()
            if dep.call is require_writer:
                return True
            todo += dep.dependencies
        return False

    routes = client.app_routes  # type: ignore[attr-defined]
    return [
        r
        for r in routes
        if isinstance(getattr(r, "original_route", r), APIRoute) and needs_writer(r)
    ]


def url_of(route: Any, ids: dict[str, Any]) -> str:
    path = re.sub(r"\{(\w+)\}", lambda m: str(ids[m.group(1)]), route.path)
    query = {
        p.name: QUERIES.get(p.name, "0")
        for p in route.dependant.query_params
        if p.field_info.is_required()
    }
    return path + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict]]:
    root = tmp_path_factory.mktemp("read-auth")
    settings = Settings(
        data_dir=root / "data",
        database_url=f"sqlite:///{root / 'db.sqlite'}",
        api_token=TOKEN,
        worker_token=WORKER,
        **RESULTS_UNCHECKED,
    )
    app = create_app(settings, checks=in_process_checks)
    with TestClient(app, base_url=LOCAL, client=LOOPBACK, headers=BEARER) as client:
        ids = seed(client, root, worker={"Authorization": f"Bearer {WORKER}"})
        models = client.get("/api/v1/models").json()
        fingerprint = next(m["fingerprint"] for m in models if m["id"] == ids["resnet"])
        job = client.get("/api/v1/jobs", params={"model_id": ids["resnet"]}).json()[0]
        client.headers.pop("Authorization")
        client.app_routes = route_table(app)  # type: ignore[attr-defined]
        yield client, {"model_id": ids["resnet"], "job_id": job["id"], "fingerprint": fingerprint}


def test_every_read_route_refuses_loopback_without_the_token(
    served: tuple[TestClient, dict],
) -> None:
    client, ids = served
    routes = get_routes(client)
    assert len(routes) >= 15, [r.path for r in routes]  # the API's reads and the pages
    read = 0
    for route in routes:
        url = url_of(route, ids)
        if route.path not in LEASED:
            # First with the token (this also fills the config cache, whose fast path must
            # refuse as the routes do), then without.
            authorised = client.get(url, headers=BEARER).status_code
            assert authorised not in (401, 403), url
            read += authorised == 200
        anon = client.get(url)
        assert anon.status_code == 401, (url, anon.status_code, anon.text[:200])
        assert FINGERPRINT not in anon.text and ids["fingerprint"] not in anon.text
        assert client.head(url).status_code in (401, 405), url
    assert read >= 15  # the seeded data was there to read


def test_the_session_cookie_reads_every_route_and_a_forged_one_none(
    served: tuple[TestClient, dict],
) -> None:
    client, ids = served
    signed = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert signed.status_code == 303
    cookie = client.cookies[SESSION_COOKIE]
    try:
        for route in get_routes(client):
            if route.path not in LEASED:
                assert client.get(url_of(route, ids)).status_code not in (401, 403), route.path
        assert client.get(f"/api/v1/models/{ids['model_id']}/file").status_code == 200
        identity, expiry, mac = cookie.split(".")[1:]
        later = str(int(expiry) + 10**6)
        for forged in (f"v1.{identity}.{later}.{mac}", f"v1.{identity}.{expiry}.{'0' * 64}", TOKEN):
            client.cookies.clear()
            client.cookies.set(SESSION_COOKIE, forged)
            assert client.get("/api/v1/models").status_code == 401, forged
            assert client.get("/").status_code == 401, forged
    finally:
        client.cookies.clear()


def test_a_session_cookie_never_authorises_a_write(
    served: tuple[TestClient, dict], tmp_path: Path
) -> None:
    client, ids = served
    program = tmp_path / "other.pt2"
    tiny_program(program, seed=7)
    client.post("/login", data={"token": TOKEN})
    try:
        routes = write_routes(client)
        assert {r.path for r in routes} >= {"/api/v1/models", "/api/v1/models/{model_id}/jobs"}
        before = client.get("/api/v1/models").json()
        for route in routes:
            url = url_of(route, ids)
            for method in route.methods:
                if route.path == "/api/v1/models":
                    with program.open("rb") as f:
                        resp = client.request(method, url, files={"file": (program.name, f)})
                else:
                    resp = client.request(method, url, json={"device": "xla"})
                assert resp.status_code == 401, (method, url, resp.text)
        assert client.get("/api/v1/models").json() == before
        jobs = client.get("/api/v1/jobs", params={"model_id": ids["model_id"]}).json()
        assert all(j["device"] != "xla" for j in jobs)
    finally:
        client.cookies.clear()


def test_the_sign_in_sends_back_only_to_this_service(served: tuple[TestClient, dict]) -> None:
    client, _ = served
    targets = {
        "/models/1?device=cpu": "/models/1?device=cpu",
        "https://evil.example/": "/",
        "//evil.example/": "/",
        "/\\evil.example": "/",
    }
    try:
        for asked, landed in targets.items():
            resp = client.post(
                "/login", data={"token": TOKEN, "next": asked}, follow_redirects=False
            )
            assert resp.status_code == 303 and resp.headers["location"] == landed, asked
            set_cookie = resp.headers["set-cookie"]
            assert "HttpOnly" in set_cookie and "samesite=strict" in set_cookie.lower()
            assert TOKEN not in set_cookie
        wrong = client.post("/login", data={"token": "guess"}, follow_redirects=False)
        assert wrong.status_code == 403 and "set-cookie" not in wrong.headers
        out = client.post("/logout", follow_redirects=False)
        assert out.status_code == 303 and client.get("/api/v1/models").status_code == 401
    finally:
        client.cookies.clear()


def test_the_log_says_when_the_service_runs_without_a_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for token in (None, TOKEN):
        caplog.clear()
        settings = Settings(
            data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'db'}", api_token=token
        )
        app = create_app(settings, checks=in_process_checks)
        with caplog.at_level(logging.INFO, "fxtune.service"), TestClient(app, base_url=LOCAL):
            pass
        said = caplog.text
        assert ("no-token mode" in said) == (token is None), said
        assert "check(s) at once" in said
