"""The demo tells a noisy machine from a model that did not speed up."""

from __future__ import annotations

from typing import Any

from examples.demo import too_noisy


def _config(verdict: str, *candidates: tuple[str, float, tuple[float, float]]) -> dict[str, Any]:
    return {
        "whole_model": {"verdict": verdict},
        "candidates": [{"name": n, "speedup": s, "ci": list(ci)} for n, s, ci in candidates],
    }


def test_a_wide_interval_is_called_noise_with_what_to_do() -> None:
    config = _config("within noise", ("eager + tuned passes", 1.6, (0.9, 2.4)), ("x", 1.0, (1, 1)))
    note = too_noisy(config)
    assert note is not None
    assert "eager + tuned passes" in note and "too noisy" in note and "--budget-s" in note


def test_a_tight_interval_or_a_shipped_speedup_is_not_noise() -> None:
    assert too_noisy(_config("within noise", ("eager", 1.01, (0.99, 1.03)))) is None
    assert too_noisy(_config("faster", ("eager + tuned passes", 1.9, (1.2, 2.6)))) is None
    assert too_noisy(_config("within noise")) is None
