"""The per-size rows of the model page: with size buckets, each size names its bucket and the
candidate marked chosen there is that bucket's decision, not the headline's."""

from __future__ import annotations

from typing import Any

from service.rows import size_rows


def _size(label: str, batch: int, speedup: float, verdict: str) -> dict[str, Any]:
    return {
        "label": label,
        "sizes": {"batch": batch},
        "speedup": speedup,
        "ci": [speedup * 0.9, speedup * 1.1],
        "verdict": verdict,
    }


def _config(buckets: list[dict[str, Any]]) -> dict[str, Any]:
    passes = {
        "name": "eager + every pass",
        "per_size": [
            _size("batch=32", 32, 4.0, "faster"),
            _size("batch=2", 2, 10.0, "faster"),
            _size("batch=1024", 1024, 0.7, "slower"),
        ],
    }
    return {"whole_model": {"name": passes["name"]}, "candidates": [passes], "buckets": buckets}


def test_without_buckets_the_headline_is_chosen_at_every_size() -> None:
    rows = size_rows(_config([]))
    assert [(r["size"], r["bucket"], r["chosen"]) for r in rows] == [
        ("batch=32", None, True),
        ("batch=2", None, True),
        ("batch=1024", None, True),
    ]


def test_each_size_shows_its_bucket_and_that_buckets_decision() -> None:
    buckets = [
        {"dim": "batch", "min": 2, "max": 181, "name": "eager + every pass"},
        {"dim": "batch", "min": 182, "max": None, "name": "original"},
    ]
    rows = size_rows(_config(buckets))
    assert [(r["size"], r["bucket"], r["bucket_decision"], r["chosen"]) for r in rows] == [
        ("batch=32", "batch in [2, 181]", "eager + every pass", True),
        ("batch=2", "batch in [2, 181]", "eager + every pass", True),
        ("batch=1024", "batch in [182, ∞]", "original", False),
    ]
