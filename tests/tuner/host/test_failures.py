"""Fallbacks that say why (tuner.host.failures): what is expected where, strict mode, the record."""

from __future__ import annotations

import pytest
import torch

from tuner.contract.errors import ArtifactFormatError
from tuner.host import failures
from tuner.host.child_env import child_environment


def _raised(fn: object) -> BaseException:
    try:
        fn()  # type: ignore[operator]
    except Exception as exc:
        return exc
    raise AssertionError("nothing was raised")


def _attribute_bug() -> None:
    None.meta  # type: ignore[attr-defined]  # noqa: B018 - the planted bug


def _inside_torch() -> None:
    """The same type of error as the bug's, raised inside torch's own code."""
    torch.nn.Linear(2, 2).get_submodule("missing")


def test_a_bug_in_our_code_is_unexpected_and_torchs_failures_are_expected() -> None:
    bug = _raised(_attribute_bug)
    assert not failures.from_torch(bug)
    assert not failures.from_torch(_raised(lambda: {}["missing"]))
    assert failures.from_torch(ArtifactFormatError("ours, on purpose"))
    # torch's C++ errors surface as RuntimeError from whichever frame called the op
    assert failures.from_torch(_raised(lambda: torch.ones(2) @ torch.ones(3)))
    inside = _raised(_inside_torch)
    assert type(inside) is type(bug), "the control must not pass by its type"
    assert failures.from_torch(inside)
    from torch._dynamo.exc import Unsupported

    assert failures.from_torch(Unsupported("a lowering failure"))  # torch's class, any frame
    assert failures.anything(bug)


def test_strict_mode_raises_the_unexpected_and_records_the_expected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(failures, "settings", lambda: failures.FailureSettings(strict=True))
    bug = _raised(_attribute_bug)
    with failures.recording() as log, pytest.raises(AttributeError):
        failures.fallback(bug, "a pass's rewrite")
    assert log.failures == []
    with failures.recording() as log:
        failure = failures.fallback(_raised(lambda: torch.ones(2) @ torch.ones(3)), "a candidate")
        failures.fallback(bug, "the float64 twin", failures.anything)
    assert failure.type == "RuntimeError" and failure.expected
    assert [f.where for f in log.failures] == ["a candidate", "the float64 twin"]


def test_without_strict_mode_a_bug_becomes_a_recorded_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(failures, "settings", lambda: failures.FailureSettings(strict=False))
    with failures.recording() as log:
        for _ in range(3):
            failure = failures.fallback(_raised(_attribute_bug), "a pass's rewrite")
    assert failure.reason == "AttributeError: 'NoneType' object has no attribute 'meta'"
    (kept,) = log.to_list()
    assert kept["expected"] is False and kept["count"] == 3
    assert "_attribute_bug" in str(kept["traceback"]) and "None.meta" in str(kept["traceback"])
    assert failures.fallback(_raised(_attribute_bug), "outside a run").type == "AttributeError"


def test_the_record_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failures, "settings", lambda: failures.FailureSettings(strict=False))

    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("x" * 10_000)
        deep(n - 1)

    with failures.recording() as log:
        for i in range(failures.MAX_RECORDS + 5):
            failures.fallback(_raised(lambda: deep(40)), f"site {i}")
    out = log.to_list()
    assert len(out) == failures.MAX_RECORDS + 1 and out[-1] == {"where": "(more)", "dropped": 5}
    assert all(len(str(f["traceback"])) <= failures.MAX_TRACEBACK_CHARS for f in out[:-1])


def test_the_loader_never_blames_the_input_for_a_bug() -> None:
    """Not even outside strict mode: a "bad upload" exits 2, which the worker never retries."""
    with pytest.raises(AttributeError):
        failures.input_fault(_raised(_attribute_bug), "deserializing")
    with failures.recording() as log:
        failures.input_fault(_raised(lambda: torch.ones(2) @ torch.ones(3)), "deserializing")
    assert [f.type for f in log.failures] == ["RuntimeError"]


def test_strict_mode_is_read_from_the_environment_and_reaches_children(tmp_path) -> None:
    read = failures.FailureSettings.from_environ
    assert read({"FXTUNE_STRICT": "1"}).strict and read({"FXTUNE_STRICT": "true"}).strict
    assert not read({}).strict and not read({"FXTUNE_STRICT": "0"}).strict
    assert failures.settings().strict, "the suite runs strict (tests/conftest.py)"
    env = child_environment(tmp_path, parent={"FXTUNE_STRICT": "1", "FXTUNE_OTHER": "x"})
    assert env["FXTUNE_STRICT"] == "1" and "FXTUNE_OTHER" not in env
