"""`make gpu-check`'s harness, run for real on the CPU: its dry run and its crash isolation."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.gpu_check import main as gpu_check
from bench.gpu_check.isolate import REPO, child_env

CRASHED = "crashed: signal 11 (SIGSEGV) during building"

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="the dry run is for machines without a GPU"
)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One dry run of two models: one that segfaults while it builds, then the dynamic MLP
    with tiny budgets in processes whose AOTInductor packages segfault as they load (as torch
    2.11's loader did on the H200; nothing is compiled, which would take minutes here), timed
    against torch.compile and AOTInductor."""
    out = tmp_path_factory.mktemp("gpu-check")
    cmd = [
        sys.executable, "-m", "bench.gpu_check", "--out", str(out), "--device", "cpu",
        "--checks", "models", "--models",
        "--model", "segv=tests.bench.gpu_check_models:SEGFAULTING",
        "--model", "mlp_dynamic=tests.bench.gpu_check_models:aoti_segfaults",
        "--peers", "torch.compile", "AOTInductor", "--tune-budget-s", "2", "--compare-s", "1",
    ]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=600
    )
    return {
        "rc": done.returncode,
        "output": done.stdout + done.stderr,
        "doc": json.loads((out / "gpu-check.json").read_text()),
        "markdown": (out / "gpu-check.md").read_text(),
        "out": out,
    }


def _rows(dry_run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in dry_run["doc"]["models"]}


@pytest.mark.slow
def test_a_model_killed_by_a_signal_is_a_crashed_row_and_the_next_still_runs(
    dry_run: dict[str, Any],
) -> None:
    rows = _rows(dry_run)
    assert list(rows) == ["segv", "mlp_dynamic"], dry_run["output"]
    assert rows["segv"]["status"] == CRASHED
    assert f"| segv | {CRASHED} |" in dry_run["markdown"]
    assert dry_run["rc"] == 1  # not every row is ok


@pytest.mark.slow
def test_a_peer_that_crashes_costs_its_column_not_the_row(dry_run: dict[str, Any]) -> None:
    """With every peer built in the row's process, the AOTInductor load's segfault on the H200
    took each model's row with it ("building the peers"), its other figures lost. AOTInductor
    is built and timed in a process of its own, under faulthandler."""
    row = _rows(dry_run)["mlp_dynamic"]
    assert row["status"] == f"peers not timed: AOTInductor: {CRASHED}", dry_run["output"]
    assert row["speedups"]["AOTInductor"]["speedup"] is None
    assert row["speedups"]["AOTInductor"]["text"] == CRASHED
    peer_log = dry_run["out"] / "logs" / "mlp_dynamic" / "mlp_dynamic.aotinductor.log"
    assert "Fatal Python error: Segmentation fault" in peer_log.read_text()


@pytest.mark.slow
def test_the_cpu_dry_run_tunes_compares_and_times_each_model(dry_run: dict[str, Any]) -> None:
    doc, row = dry_run["doc"], _rows(dry_run)["mlp_dynamic"]
    assert doc["status"] == "dry run on the CPU (no GPU figures): 0 of 2 rows ok"
    assert doc["device"] == "cpu" and doc["peers"] == ["torch.compile", "AOTInductor"]
    assert row["tune"]["rc"] == 0 and row["tune"]["wall_s"] > 0
    assert row["backend"] in ("eager", "inductor", "compile") and row["verified"]
    assert row["outputs"] == "equal" and row["max_abs_error"] < 1e-4
    assert set(row["speedups"]) == {"eager", "torch.compile", "AOTInductor"}
    # A loaded CPU may end a 1 s comparison before its first round: then the figure is open.
    for peer in ("eager", "torch.compile"):
        figures = row["speedups"][peer]
        assert (figures["speedup"] > 0) if figures["rounds"] else figures["speedup"] is None
    assert row["ops_per_iter"]["baseline"] > 0  # from the report's profiles
    line = next(ln for ln in dry_run["markdown"].splitlines() if ln.startswith("| mlp_dynamic |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["mlp_dynamic", f"peers not timed: AOTInductor: {CRASHED}", "0"]
    assert cells[7] == row["speedups"]["eager"]["text"]  # x eager: ratio and interval
    assert re.fullmatch(r"\d+\.\d\dx (\[.+, .+\]|\(open\))|-", cells[7])
    assert (dry_run["out"] / row["tune"]["log"]).is_file()  # logs kept in OUT, work removed


def test_archived_logs_are_one_file_under_the_names_the_rows_give(tmp_path: Path) -> None:
    """The device tool sends back at most 8 files: `--archive-logs` keeps the rows' logs, jobs
    and reports in one archive, under the `logs/...` names the table gives them; traces and
    the service's data folder stay out, as they do from the folder."""
    import tarfile

    work, out = tmp_path / "work", tmp_path / "out"
    for rel in ("cnn/tune.log", "cnn/report.json", "cnn.log", "cnn/x.trace.json",
                "service/data/fxtune.db.json", "service/service.log"):  # fmt: skip
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(rel)
    gpu_check._keep_logs(work, out, archive=True)
    assert os.listdir(out) == [gpu_check.LOGS_ARCHIVE]
    with tarfile.open(out / gpu_check.LOGS_ARCHIVE) as tar:
        names = sorted(tar.getnames())
        log = tar.extractfile("logs/cnn/tune.log")
        assert log is not None and log.read() == b"cnn/tune.log"
    assert names == ["logs/cnn.log", "logs/cnn/report.json", "logs/cnn/tune.log",
                     "logs/service/service.log"]  # fmt: skip
    gpu_check._keep_logs(work, tmp_path / "tree")
    kept = sorted(str(p.relative_to(tmp_path / "tree")) for p in (tmp_path / "tree").rglob("*.*"))
    assert kept == names


def test_without_cuda_it_reports_nothing_checked_and_exits_0(tmp_path: Path) -> None:
    assert gpu_check.main(["--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu-check.json").read_text())
    assert doc["status"].startswith("no CUDA device: nothing checked")
    assert "no CUDA device: nothing checked" in (tmp_path / "gpu-check.md").read_text()
    assert set(os.listdir(tmp_path)) == {"gpu-check.json", "gpu-check.md"}


def test_on_an_unchecked_torch_the_check_runs_with_the_override_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The H200's torch is 2.11: without the override every row failed closed at the first
    private API. The check sets it for itself and its children and writes why in the table."""
    from bench.gpu_check import tables
    from tuner.contract.device import Device
    from tuner.host.torch_compat import ALLOW_ENV

    monkeypatch.delenv(ALLOW_ENV, raising=False)
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    info = gpu_check._machine(Device.parse("cpu"))
    assert os.environ[ALLOW_ENV] == "1" and child_env()[ALLOW_ENV] == "1"
    assert "torch 2.11.0+cu130 is not a series fxtune was checked on" in info["unchecked_torch"]
    doc = {"status": "s", "started": "t", **info}
    assert info["unchecked_torch"] in tables.markdown(doc)
    monkeypatch.delenv(ALLOW_ENV)
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    assert "unchecked_torch" not in gpu_check._machine(Device.parse("cpu"))
    assert ALLOW_ENV not in os.environ
