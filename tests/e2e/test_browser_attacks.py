"""Web pages against the service, in real headless Chromium.

A page from another local origin (127.0.0.2, its own HTTP server) auto-submits a multipart upload
form to the service, as any site a user visits could; and a page whose name resolves to 127.0.0.1
(DNS rebinding, simulated with Chromium's host resolver rules) reads the API. Both are refused,
while the same bytes from a non-browser client are accepted. With a token, a browser signed in
to the dashboard holds a session cookie; another site's page can neither read with it nor write.
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.screenshots import CHROMIUM_ARGS, chromium_path
from service.launch import free_port, serve_process
from tests.service.helpers import fxtune_env, tiny_program

pytestmark = pytest.mark.e2e

ATTACKER_HOST = "127.0.0.2"
REBOUND_NAME = "attacker.example"

TOKEN = "attack-s3cret"
# A signed-in user visits this page: it reads the API with the user's cookies, then posts a form.
SESSION_ATTACK_PAGE = """<!doctype html>
<html><body>
<form id="f" method="post" enctype="multipart/form-data" action="{action}">
  <input type="file" name="file"><input type="hidden" name="name" value="planted">
</form>
<script>
  fetch("{read}", {{credentials: "include", mode: "no-cors"}}).finally(() => {{
    const box = new DataTransfer();
    box.items.add(new File([new Uint8Array([80, 75, 5, 6])], "planted.pt2"));
    document.querySelector("input[type=file]").files = box.files;
    document.getElementById("f").submit();
  }});
</script>
</body></html>
"""
ATTACK_PAGE = """<!doctype html>
<html><body>
<form id="f" method="post" enctype="multipart/form-data" action="{action}">
  <input type="file" name="file"><input type="hidden" name="name" value="planted">
</form>
<script>
  const bytes = Uint8Array.from(atob("{payload}"), c => c.charCodeAt(0));
  const box = new DataTransfer();
  box.items.add(new File([bytes], "planted.pt2", {{type: "application/octet-stream"}}));
  document.querySelector("input[type=file]").files = box.files;
  document.getElementById("f").submit();
</script>
</body></html>
"""


@contextlib.contextmanager
def attacker_site(page_html: str) -> Iterator[str]:
    """Serve one page from 127.0.0.2 on its own port: another origin, and another site."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page_html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer((ATTACKER_HOST, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{ATTACKER_HOST}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def chromium() -> str:
    path = chromium_path()
    if path is None:
        pytest.skip("no chromium: install Debian's (apt-get install chromium); .ci/run does")
    return path


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_DATABASE_URL=f"sqlite:///{tmp_path / 'fxtune.db'}",
        FXTUNE_WARM_CHECKERS="0",  # the attacks are refused before any check
    )
    with serve_process(env, tmp_path / "serve.log") as url:
        yield url


def test_a_cross_site_form_upload_is_refused_in_no_token_mode(
    chromium: str, service: str, tmp_path: Path
) -> None:
    program = tmp_path / "planted.pt2"
    tiny_program(program)
    payload = base64.b64encode(program.read_bytes()).decode()
    html = ATTACK_PAGE.format(action=f"{service}/api/v1/models", payload=payload)
    from playwright.sync_api import sync_playwright

    with attacker_site(html) as attack_url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            with page.expect_response(f"{service}/api/v1/models") as answer:
                page.goto(attack_url)
            resp = answer.value
            sent = resp.request.all_headers()
            assert sent["origin"] == attack_url.rstrip("/"), sent  # really a cross-site post
            assert resp.request.method == "POST"
            assert resp.status == 403
            assert "cross-site" in resp.json()["detail"]
        finally:
            browser.close()
    assert httpx.get(f"{service}/api/v1/models").json() == []  # no model row was created
    # The very same bytes from a non-browser client on loopback are a fine upload.
    with program.open("rb") as f:
        ok = httpx.post(f"{service}/api/v1/models", files={"file": ("p.pt2", f)}, timeout=60)
    assert ok.status_code == 201, ok.text


def test_a_dns_rebinding_page_cannot_read_or_write(chromium: str, service: str) -> None:
    port = int(service.rsplit(":", 1)[1])
    from playwright.sync_api import sync_playwright

    rebind = f"--host-resolver-rules=MAP {REBOUND_NAME} 127.0.0.1"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[*CHROMIUM_ARGS, rebind])
        try:
            page = browser.new_page()
            resp = page.goto(f"http://{REBOUND_NAME}:{port}/api/v1/models")
            assert resp is not None and resp.status == 403
            assert "FXTUNE_ALLOWED_HOSTS" in resp.json()["detail"]
            # The page's own scripts are same-origin with the rebound name: still refused.
            status = page.evaluate(
                """async () => (await fetch("/api/v1/models/1/jobs", {method: "POST",
                   headers: {"content-type": "application/json"},
                   body: JSON.stringify({device: "cpu"})})).status"""
            )
            assert status == 403
        finally:
            browser.close()
    own = httpx.get(f"{service}/api/v1/models")
    assert own.status_code == 200  # the real address still works


def test_the_host_header_must_name_the_service(tmp_path: Path) -> None:
    """Without a browser: any client naming another host is refused, a configured name is not."""
    program = tmp_path / "m.pt2"
    tiny_program(program)
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_DATABASE_URL=f"sqlite:///{tmp_path / 'fxtune.db'}",
        FXTUNE_ALLOWED_HOSTS="fxtune.internal",
        FXTUNE_WARM_CHECKERS="0",  # one upload gets through: a checker started for it is enough
    )
    with serve_process(env, tmp_path / "serve.log") as url:
        port = url.rsplit(":", 1)[1]
        for host in (f"{REBOUND_NAME}:{port}", REBOUND_NAME, f"127.0.0.1:{free_port()}"):
            resp = httpx.get(f"{url}/api/v1/models", headers={"Host": host})
            assert resp.status_code == 403, host
            assert "not an address of this service" in resp.json()["detail"]
            with program.open("rb") as f:
                up = httpx.post(
                    f"{url}/api/v1/models", files={"file": f}, headers={"Host": host}, timeout=60
                )
            assert up.status_code == 403
        assert httpx.get(f"{url}/api/v1/models").json() == []
        for host in (f"localhost:{port}", f"[::1]:{port}", f"fxtune.internal:{port}"):
            resp = httpx.get(f"{url}/api/v1/models", headers={"Host": host})
            assert resp.status_code == 200, host


def test_another_site_cannot_use_a_signed_in_session(chromium: str, tmp_path: Path) -> None:
    """SameSite=Strict: a read the other site starts goes without the cookie (401), and its
    form upload is refused (a cross-site write, and a cookie authorises no write anyway)."""
    env = fxtune_env(
        FXTUNE_DATA_DIR=str(tmp_path / "data"),
        FXTUNE_DATABASE_URL=f"sqlite:///{tmp_path / 'fxtune.db'}",
        FXTUNE_API_TOKEN=TOKEN,
        FXTUNE_WARM_CHECKERS="0",
    )
    from playwright.sync_api import sync_playwright

    with serve_process(env, tmp_path / "serve.log") as service, sync_playwright() as pw:
        html = SESSION_ATTACK_PAGE.format(
            action=f"{service}/api/v1/models", read=f"{service}/api/v1/models"
        )
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{service}/login")
            page.fill("#login-token", TOKEN)
            page.click("#login-form button[type=submit]")
            page.wait_for_url(f"{service}/")
            assert page.context.request.get(f"{service}/api/v1/models").status == 200
            answers: list[Any] = []
            page.on("response", lambda r: answers.append(r) if "/api/v1/" in r.url else None)
            with (
                attacker_site(html) as attack_url,
                page.expect_response(
                    lambda r: r.url == f"{service}/api/v1/models" and r.request.method == "POST"
                ),
            ):
                page.goto(attack_url)
            read = next(r for r in answers if r.request.method == "GET")
            assert "cookie" not in read.request.all_headers()
            assert read.status == 401
            write = next(r for r in answers if r.request.method == "POST")
            assert write.status in (401, 403) and "cookie" not in write.request.all_headers()
        finally:
            browser.close()
        listed = httpx.get(f"{service}/api/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
        assert listed.json() == []
