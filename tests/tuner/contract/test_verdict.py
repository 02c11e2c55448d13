"""Verdicts are a StrEnum whose values are the JSON strings configs always held: a config written
when `Verdict` was a Literal loads, and is written back with the same strings; the tuner's code
names verdicts by member, not by literal."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from tuner.contract.config import SiteDecision, TunedConfig, Verdict

TUNER = Path(__file__).resolve().parents[3] / "tuner"
# The values of the Literal that `Verdict` was (the service's database and the dashboard hold them).
LITERAL = (
    "faster", "slower", "within noise", "wrong outputs", "failed to run", "crashed", "not measured"
)  # fmt: skip
# The same words meaning something else: a profile figure that was not measured.
NOT_VERDICTS = {("tuner/profiling/report.py", "not measured")}


def _old_config(verdict: str = "wrong outputs") -> dict:
    figures = {"baseline_s": 1e-3, "candidate_s": 5e-4, "speedup": 2.0, "ci": [1.9, 2.1]}
    per_size = [
        {"label": "batch=1", "sizes": {"batch": 1}, "rounds": 9, "verdict": "faster", **figures},
        {"label": "batch=64", "sizes": {"batch": 64}, "rounds": 0, "verdict": "not measured"},
    ]
    return {
        "schema_version": 4,
        "model_fingerprint": "f" * 32,
        "hardware": {"device": "cpu"},
        "backend": "eager",
        "passes": [],
        "sites": [
            {"pass": "p", "site_id": "a", "summary": "s", "accepted": False, "verdict": verdict},
            {
                "pass": "p",
                "site_id": "b",
                "summary": "s",
                "accepted": True,
                "verdict": "faster",
                "rounds": 9,
                "per_size": per_size,
                **figures,
            },
        ],
        "candidates": [
            {"name": n, "backend": "eager", "passes": [], "verdict": v}
            for n, v in [("a", "crashed"), ("b", "failed to run"), ("c", "slower")]
        ],
        "whole_model": {
            "name": "original",
            "backend": "eager",
            "passes": [],
            "verdict": "within noise",
        },
        "verification": {"inputs": 0, "max_abs_error": 0, "max_rel_error": 0, "passed": True},
        "tuning": {},
    }


def test_the_members_are_the_literals_strings() -> None:
    assert [v.value for v in Verdict] == list(LITERAL)
    for text in LITERAL:
        member = Verdict(text)
        assert member == text and f"{member}" == text and json.dumps(member) == f'"{text}"'


def test_a_config_written_with_string_verdicts_loads_and_writes_the_same_strings() -> None:
    old = _old_config()
    config = TunedConfig.model_validate_json(json.dumps(old))
    assert config.sites[0].verdict is Verdict.WRONG_OUTPUTS
    assert config.sites[1].per_size[1].verdict is Verdict.NOT_MEASURED
    assert config.whole_model.verdict == "within noise"  # readers that compare strings
    again = json.loads(config.to_json())

    def verdicts(doc: dict) -> list[str]:
        sites = [s["verdict"] for s in doc["sites"]]
        sizes = [f["verdict"] for f in doc["sites"][1]["per_size"]]
        rest = [c["verdict"] for c in doc["candidates"]] + [doc["whole_model"]["verdict"]]
        return sites + sizes + rest

    assert verdicts(again) == verdicts(old)
    assert all(type(v) is str for v in verdicts(again))


def test_an_unknown_verdict_is_refused() -> None:
    with pytest.raises(ValidationError):
        TunedConfig.model_validate(_old_config("quicker"))
    with pytest.raises(ValidationError):
        SiteDecision(pass_name="p", site_id="a", summary="s", accepted=False, verdict="faster!")


def _verdict_literals(path: Path) -> list[str]:
    """String constants in `path` that spell a verdict, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        f"{path.relative_to(TUNER.parent)}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and node.value in LITERAL
        and id(node) not in docstrings
        and (str(path.relative_to(TUNER.parent)), node.value) not in NOT_VERDICTS
    ]


def test_the_tuner_names_verdicts_by_member() -> None:
    found = [hit for path in sorted(TUNER.rglob("*.py")) for hit in _verdict_literals(path)]
    contract = [hit for hit in found if hit.startswith("tuner/contract/config.py")]
    assert len(contract) == len(LITERAL)  # the enum's own values: the control that this sees
    assert [hit for hit in found if hit not in contract] == []
