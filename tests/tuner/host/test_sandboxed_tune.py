"""`fxtune tune` compiles in the worker's sandbox by default (round 3: the assert-message program
ran native code on the command line), and hands back only the files it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.crafted import assert_message, cpp_payload
from tests.service.helpers import REPO
from tuner.graph.capture import export_module, save_program
from tuner.host.sandbox import bwrap_works
from tuner.host.sandboxed_tune import Beside, Request, _delivered, summary_of

needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap cannot run here")


def fxtune(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "FXTUNE_TUNE_SANDBOX"}
    cmd = [sys.executable, "-m", "fxtune_cli", *args]
    return subprocess.run(
        cmd, cwd=REPO, env={**environ, **(env or {})}, capture_output=True, text=True, timeout=600
    )


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@needs_bwrap
def test_a_sandboxed_tune_delivers_its_outputs_and_merges_its_checked_records(
    tmp_path: Path,
) -> None:
    model = save_program(export_module(Dropped().eval(), (torch.randn(8, 32),)), tmp_path / "m.pt2")
    out, report, cache = (
        tmp_path / "out" / "m_tuned.pt2",
        tmp_path / "r" / "report.json",
        tmp_path / "c" / "decisions.json",
    )
    done = fxtune(
        "tune", str(model), "--out", str(out), "--report", str(report), "--budget-s", "10",
        "--backend", "eager", "--cache", str(cache),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "chosen:" in done.stdout  # the child's summary, shown here
    assert torch.export.load(out).module()(torch.randn(8, 32)).shape == (8, 32)
    doc = json.loads(report.read_text())
    assert (report.parent / doc["artifacts"]["program"]).resolve() == out.resolve()
    for trace in doc["artifacts"]["traces"].values():
        assert (report.parent / trace).is_file()  # beside the report, as an unsandboxed run
    # The child only read a snapshot; what it measured came back, checked, and nothing else.
    merged = json.loads(cache.read_text()) if cache.is_file() else {}
    measured = {
        s["site_id"]
        for s in doc["config"]["sites"]
        if s["verdict"] not in ("not measured", "failed to run") and not s["cached"]
    }
    assert {k.rsplit("::", 1)[1].split("@")[0] for k in merged} == measured


@needs_bwrap
def test_the_assert_message_program_is_refused_with_exit_3(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    exploit = assert_message(tmp_path / "exploit.pt2", cpp_payload(marker))
    done = fxtune(
        "tune", str(exploit), "--out", str(tmp_path / "t.pt2"), "--report",
        str(tmp_path / "r.json"), "--budget-s", "60",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "assert_msg" in done.stderr and not marker.exists()


def test_without_bubblewrap_it_refuses_and_says_what_to_do(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    done = fxtune(
        "tune", str(tmp_path / "m.pt2"), "--out", str(tmp_path / "t.pt2"), "--report",
        str(tmp_path / "r.json"), env={"PATH": str(bin_dir)},
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    text = " ".join(done.stderr.split())
    assert "bubblewrap" in text and "--no-sandbox" in text


def test_only_the_names_fxtune_writes_are_copied_back(tmp_path: Path) -> None:
    """The child names the files in its report: none may land on another of the user's."""
    out = tmp_path / "sandbox"
    out.mkdir()
    for name in ("m.pt2", "m.aoti.pt2", "Makefile", "baseline.trace.json"):
        (out / name).write_text(name)
    dest = tmp_path / "dest"
    request = Request(tmp_path / "in.pt2", dest / "m.pt2", dest / "r.json", [], 10.0)
    beside = Beside(dest, __import__("re").compile(r"m\.[\w.\-]+"))
    artifacts = {"aoti": "m.aoti.pt2", "evil": "Makefile", "escape": "../in.pt2", "note": "text"}
    kept = _delivered(artifacts, out, request, beside)
    assert kept == {"aoti": "m.aoti.pt2", "evil": None, "escape": "../in.pt2", "note": "text"}
    assert sorted(p.name for p in dest.iterdir()) == ["m.aoti.pt2"]


def test_the_summary_shown_is_the_childs_table_not_its_libraries_log() -> None:
    log = "USDT: profiler_start\nSkipping constant folding\n┏━━┓\n┃ a ┃\n┗━━┛\nchosen: eager\n"
    assert summary_of(log) == "┏━━┓\n┃ a ┃\n┗━━┛\nchosen: eager"
    assert summary_of("only a line") == "only a line"
