"""Dashboard screenshots for the docs: `python -m examples.screenshots [--out docs]`.

Runs what `make demo` runs (the example models built, uploaded over HTTP and tuned by an embedded
worker), then photographs the overview and the model page with the most site decisions in
headless Chromium: Debian's `chromium` driven by Playwright, never a downloaded browser.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx

from examples.demo import console, follow, service, upload_all

CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
VIEWPORT = {"width": 1280, "height": 900}


def chromium_path() -> str | None:
    if Path("/usr/bin/chromium").is_file():
        return "/usr/bin/chromium"
    return shutil.which("chromium") or shutil.which("chromium-browser")


def richest_model(http: httpx.Client, final: dict[str, Any]) -> int:
    """The succeeded model with the most site decisions: the most telling model page."""

    def sites(job: dict[str, Any]) -> int:
        resp = http.get(f"/api/v1/models/{job['model_id']}/config", params={"device": "cpu"})
        return len(resp.json()["sites"]) if resp.status_code == 200 else -1

    done = [j for j in final.values() if j["status"] == "succeeded"]
    if not done:
        raise RuntimeError("no example model was tuned; nothing to photograph")
    return max(done, key=sites)["model_id"]


def shoot(url: str, model_id: int, out: Path, executable: str) -> list[Path]:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    shots = [(f"{url}/", out / "dashboard-index.png")]
    shots.append((f"{url}/models/{model_id}?device=cpu", out / "dashboard-model.png"))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            for address, path in shots:
                page.goto(address)
                page.wait_for_load_state("networkidle")
                page.screenshot(path=str(path), full_page=True)
        finally:
            browser.close()
    return [path for _, path in shots]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs"), help="where the PNGs go")
    parser.add_argument("--budget-s", type=float, default=20, help="tuning budget per model")
    args = parser.parse_args(argv)
    executable = chromium_path()
    if executable is None:
        console.print("chromium is not installed (apt-get install chromium)", style="red")
        return 2
    from examples.build import build_all

    with tempfile.TemporaryDirectory(prefix="fxtune-shots-") as tmp:
        root = Path(tmp)
        models = build_all(root / "models")
        with (
            service(root / "data", root / "serve.log") as url,
            httpx.Client(base_url=url, timeout=120) as http,
        ):
            final = follow(http, upload_all(http, models, args.budget_s))
            paths = shoot(url, richest_model(http, final), args.out, executable)
    for path in paths:
        console.print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
