"""What a job measured reaches the shared caches only as checked records (round 3's poisoning)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuner.host.job_caches import (
    COMPILE_TIMES,
    DECISIONS,
    hardware_part,
    merge_recorded,
    report_sites,
    snapshot,
)

HW = "cpu|Some CPU|torch2.13.0"
SITE, VICTIM = "0123456789abcdef", "fedcba9876543210"


def decision(site: str = SITE, accepted: bool = True) -> dict[str, Any]:
    return {
        "baseline_s": 1e-5,
        "candidate_s": 5e-6,
        "speedup": 2.0,
        "ci": [1.9, 2.1],
        "rounds": 20,
        "verdict": "faster",
        "pass": "remove_dropout",
        "site_id": site,
        "summary": "dropout",
        "accepted": accepted,
    }


def key(site: str = SITE, hw: str = f"{HW}|t2") -> str:
    return f"{hw}::eager::remove_dropout@be1154463e::{site}"


def record(folder: Path, decisions: Any = None, times: Any = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    if decisions is not None:
        (folder / DECISIONS).write_text(json.dumps(decisions))
    if times is not None:
        (folder / COMPILE_TIMES).write_text(json.dumps(times))
    return folder


def test_a_jobs_checked_records_are_merged(tmp_path: Path) -> None:
    store = tmp_path / "shared" / DECISIONS
    new = {key(): decision(), key(f"{SITE}@batch=1;batch=32"): decision()}
    times = {f"{HW}|t1::inductor": [[120, 18.5]]}
    merged = merge_recorded(record(tmp_path / "job", new, times), store, HW, {SITE})
    assert (merged.decisions, merged.compile_times, merged.refused) == (2, 1, [])
    assert set(json.loads(store.read_text())) == set(new)
    assert json.loads(store.with_name(COMPILE_TIMES).read_text()) == times


def test_poisoned_records_are_refused_and_kept_ones_never_replaced(tmp_path: Path) -> None:
    store = tmp_path / "shared" / DECISIONS
    store.parent.mkdir()
    kept = decision(accepted=False)
    store.write_text(json.dumps({key(): kept}))
    new = {
        key(): decision(),  # replaces a record already there: ignored
        key(VICTIM): decision(VICTIM),  # a site the job's report does not name
        key(hw="cpu|Other CPU|torch2.13.0|t2"): decision(),  # other hardware
        key(f"{SITE}\n"): decision(),  # malformed site
        "just-a-key": decision(),
        key(SITE + "@x=1"): {"verdict": "faster"},  # not a decision
        key(SITE + "@x=2"): decision(VICTIM),  # a decision for another site than its key
    }
    times = {
        f"{HW}|t1::inductor": [[100, 0.001]],  # implausible: planning would start any compile
        "cpu|Other|torch2.13.0|t1::inductor": [[100, 20.0]],
        f"{HW}|t1::compile": "fast",
    }
    merged = merge_recorded(record(tmp_path / "job", new, times), store, HW, {SITE})
    assert (merged.decisions, merged.compile_times) == (0, 0)
    assert len(merged.refused) == len(new) - 1 + len(times)
    assert json.loads(store.read_text()) == {key(): kept}
    assert not store.with_name(COMPILE_TIMES).exists()


@pytest.mark.parametrize(
    "content", ["not json", "[1, 2]", json.dumps({str(i): 1 for i in range(20_001)})]
)
def test_unreadable_records_are_refused_whole(tmp_path: Path, content: str) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / DECISIONS).write_text(content)
    merged = merge_recorded(job, tmp_path / "shared" / DECISIONS, HW, {SITE})
    assert merged.decisions == 0 and len(merged.refused) == 1


def test_a_snapshot_is_a_copy_the_job_cannot_write_back_through(tmp_path: Path) -> None:
    store = tmp_path / "shared" / DECISIONS
    record(store.parent, {key(): decision()}, {f"{HW}|t1::inductor": [[1, 2.0]]})
    copy = snapshot(store, tmp_path / "job" / "cache")
    assert copy.read_text() == store.read_text()
    copy.write_text("{}")
    assert json.loads(store.read_text()) == {key(): decision()}


def test_the_report_names_the_hardware_and_sites() -> None:
    report = {
        "config": {
            "hardware": {"device": "cpu", "name": "Some CPU", "torch": "2.13.0", "threads": 2},
            "sites": [{"site_id": SITE}, {"site_id": VICTIM}, {"nothing": 1}],
        }
    }
    hardware, sites = report_sites(report)
    assert hardware == f"{HW}|t2" and hardware_part(hardware) == HW
    assert sites == {SITE, VICTIM}
    assert report_sites({"config": "x"}) == (None, set())
