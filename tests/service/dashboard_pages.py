"""The dashboard tests' seeded service and page reader: results stored the way a worker stores
them (claim, then complete over the API), and the tables, links and JSON blocks of a page."""

from __future__ import annotations

import json
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.service.fakes import (
    config,
    fake_aoti_package,
    program_fingerprint,
    upload_parts,
    write_result,
)
from tests.service.helpers import tiny_program, variant

LOOPBACK = ("127.0.0.1", 40000)
ELSEWHERE = ("203.0.113.9", 40000)
TOKEN = "dash-s3cret"


def site(pass_name: str, site_id: str, count: int, base: Any, cand: Any, **rest: Any) -> dict:
    speedup = base / cand if base and cand else None
    ci = [speedup * 0.95, speedup * 1.05] if speedup else None
    fields = {"speedup": speedup, "ci": ci, "rounds": 40 if speedup else 0}
    return {
        "pass": pass_name,
        "site_id": site_id,
        "summary": f"{pass_name} site",
        "count": count,
        "baseline_s": base,
        "candidate_s": cand,
        **fields,
        **rest,
    }


def candidate(name: str, backend: str, speedup: float, verdict: str, ci: Any) -> dict:
    passes = [{"pass": "remove_dropout", "sites": ["s1"]}] if "passes" in name else []
    return {
        "name": name,
        "backend": backend,
        "passes": passes,
        "baseline_s": 3e-3,
        "candidate_s": 3e-3 / speedup,
        "speedup": speedup,
        "ci": ci,
        "rounds": 30,
        "verdict": verdict,
    }


def rich_config(threads: int = 1, original_kept: bool = False) -> dict[str, Any]:
    """Four sites: the one saving most per call is not the fastest per site (count 4)."""
    cfg = config(speedup=1.8, threads=threads)
    cfg["sites"] = [
        site("remove_dropout", "s1", 1, 1e-5, 5e-6, verdict="faster", accepted=True),
        site("fuse_horizontal_linear", "s2", 4, 2e-5, 1.5e-5, verdict="faster", accepted=True),
        site("channels_last", "s3", 2, 1e-5, 1.2e-5, verdict="slower", accepted=False),
        site(
            "fold_conv_bn",
            "s4",
            1,
            None,
            None,
            verdict="not measured",
            accepted=False,
            reason="the budget ran out",
        ),
    ]
    cfg["candidates"] = [
        candidate("eager + tuned passes", "eager", 1.8, "faster", [1.7, 1.9]),
        candidate("inductor", "inductor", 0.9, "slower", [0.85, 0.95]),
        candidate("inductor + tuned passes", "inductor", 1.01, "within noise", [None, 1.1]),
    ]
    # A dynamic batch tuned at three sizes: the chosen candidate's figures at each.
    cfg["shapes"] = {"dims": [{"name": "batch", "min": 2, "max": 4096}], "inputs": [["batch", 3]]}
    cfg["tuning"]["sizes"] = [{"label": f"batch={b}", "sizes": {"batch": b}} for b in (32, 2, 512)]
    cfg["tuning"]["sizes_skipped"] = ["batch=1: outside the program's range"]
    cfg["candidates"][0]["per_size"] = [
        {"label": "batch=32", "sizes": {"batch": 32}, "speedup": 1.8, "ci": [1.7, 1.9],
         "baseline_s": 2e-4, "candidate_s": 1.1e-4, "rounds": 9, "verdict": "faster"},
        {"label": "batch=2", "sizes": {"batch": 2}, "speedup": 2.5, "ci": [2.4, 2.6],
         "baseline_s": 1e-4, "candidate_s": 4e-5, "rounds": 9, "verdict": "faster"},
        {"label": "batch=512", "sizes": {"batch": 512}, "speedup": 1.01, "ci": [0.99, 1.03],
         "baseline_s": 2e-3, "candidate_s": 1.98e-3, "rounds": 9, "verdict": "within noise"},
    ]  # fmt: skip
    cfg["whole_model"] = cfg["candidates"][0]
    if original_kept:
        reason = "no candidate was faster than the original beyond noise; the original stands"
        cfg["whole_model"] = {
            "name": "original",
            "backend": "eager",
            "passes": [],
            "verdict": "within noise",
            "reason": reason,
        }
        cfg["passes"] = []
    return cfg


def profile(ops: float, wall: float, overhead: float, matmul: float) -> dict[str, Any]:
    return {
        "device": "cpu",
        "iterations": 20,
        "ops_per_iter": ops,
        "kernels_per_iter": None,
        "time_by_category_us": {"matmul_conv": matmul, "pointwise": 4.0, "collective": 0.0},
        "wall_us_per_iter": wall,
        "cpu_dispatch_overhead_us": overhead,
        "device_idle_us": None,
        "peak_memory_bytes": 4096,
        "trace_path": None,
        "top_ops": [],
        "missing": ["device_idle_us: on CPU the host runs the kernels; there is no device to idle"],
    }


PROFILES = {
    "baseline": profile(12.0, 300.0, 200.0, 60.0),
    "tuned": profile(9.0, 150.0, 90.0, 40.0),
}


def store_result(
    client: TestClient,
    program: Path,
    out: Path,
    cfg: dict[str, Any],
    profiles: dict[str, Any] | None = None,
    aoti: bool = False,
    worker: dict[str, str] | None = None,
) -> None:
    """Claim the next job and complete it with `cfg`, as a worker (`worker`: its headers)."""
    claim = client.post(
        "/api/v1/jobs/claim", json={"worker_id": "w1", "device": "cpu"}, headers=worker
    )
    assert claim.status_code == 200, claim.text
    job = claim.json()
    files = write_result(out, program, {**cfg, "model_fingerprint": program_fingerprint(program)})
    report = json.loads(files["report"].read_text())
    report["profiles"] = profiles if profiles is not None else PROFILES
    files["report"].write_text(json.dumps(report))
    if aoti:
        files["aoti"] = fake_aoti_package(out / "model.aoti.pt2", program_fingerprint(program))
    resp = client.post(
        f"/api/v1/jobs/{job['job']['id']}/complete",
        data={"lease_token": job["lease_token"]},
        files=upload_parts(files),
        headers=worker,
    )
    assert resp.status_code == 200, resp.text


def upload(client: TestClient, path: Path, name: str) -> dict[str, Any]:
    with path.open("rb") as f:
        resp = client.post(
            "/api/v1/models", files={"file": (path.name, f)}, data={"name": name, "tune": "true"}
        )
    assert resp.status_code == 201, resp.text
    return resp.json()


def seed(client: TestClient, root: Path, worker: dict[str, str] | None = None) -> dict[str, int]:
    """`resnet` tuned on two CPUs (AOTI on the newer one), `bert` tuned with its original kept,
    `new` uploaded and queued; `worker`: the worker's headers when the service has tokens."""
    program = root / "tiny.pt2"
    tiny_program(program)
    ids = {"resnet": upload(client, program, "resnet")["id"]}
    store_result(client, program, root / "r1", rich_config(threads=1), worker=worker)
    client.post(f"/api/v1/models/{ids['resnet']}/jobs", json={"device": "cpu"})
    store_result(client, program, root / "r4", rich_config(threads=4), aoti=True, worker=worker)
    bert = variant(program, root / "bert.pt2", "bert")
    ids["bert"] = upload(client, bert, "bert")["id"]
    kept = rich_config(original_kept=True)
    store_result(client, program, root / "b1", kept, profiles={}, worker=worker)
    ids["new"] = upload(client, variant(program, root / "new.pt2", "new"), "new")["id"]
    return ids


@dataclass
class Cell:
    text: str
    value: float | None
    classes: list[str]


@dataclass
class TableRow:
    attrs: dict[str, str]
    cells: list[Cell]

    def text(self, i: int) -> str:
        return self.cells[i].text


class Page(HTMLParser):
    """Body rows of every table with an id, every link, and the JSON blocks of a page."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.tables: dict[str, list[TableRow]] = {}
        self.links: list[dict[str, str]] = []
        self.assets: list[str] = []
        self.json: dict[str, Any] = {}
        self._table: str | None = None
        self._row: TableRow | None = None
        self._cell: Cell | None = None
        self._in_head_row = False
        self._script: str | None = None
        self._text: list[str] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table" and "id" in a:
            self._table = a["id"]
            self.tables[self._table] = []
        elif tag == "thead":
            self._in_head_row = True
        elif tag == "tr" and self._table and not self._in_head_row:
            self._row = TableRow(a, [])
        elif tag in ("td", "th") and self._row is not None:
            value = float(a["data-value"]) if a.get("data-value") else None
            self._cell = Cell("", value, a.get("class", "").split())
            self._text = []
        elif tag == "a":
            self.links.append(a)
        if tag == "script" and a.get("type") == "application/json":
            self._script, self._text = a["id"], []
        if tag == "script" and "src" in a:
            self.assets.append(a["src"])
        if tag == "link" and "href" in a:
            self.assets.append(a["href"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "thead":
            self._in_head_row = False
        elif tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._cell.text = " ".join("".join(self._text).split())
            self._row.cells.append(self._cell)
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "script" and self._script is not None:
            self.json[self._script] = json.loads("".join(self._text))
            self._script = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None or self._script is not None:
            self._text.append(data)


def page(client: TestClient, url: str) -> Page:
    resp = client.get(url)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/html")
    return Page(resp.text)


def report(client: TestClient, model_id: int, **params: str) -> dict[str, Any]:
    resp = client.get(f"/api/v1/models/{model_id}/report", params={"device": "cpu", **params})
    assert resp.status_code == 200, resp.text
    return resp.json()
