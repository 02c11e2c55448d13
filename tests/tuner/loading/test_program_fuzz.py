"""A mutation fuzzer over real programs' JSON: every string field gets payloads of each class
(code in expressions, guards and names; quotes, newlines, huge text), every number extremes, and
objects unknown keys. One base program passes strings to twelve operators, so operators' string
arguments get the payloads too. For each mutant, what `fxtune sites` does (safe load, resource
bounds, capture, every pass's site search) must end in fxtune's own refusal or a clean run, with
no marker file, no string that could end a literal passed to an operator, and memory under a
cap.

FXTUNE_FUZZ_EXAMPLES sets the number of cases (default 120 in the suite).
"""

from __future__ import annotations

import json
import os
import resource
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.crafted import dynamic_program, good_program, rewrite, strings_program_file
from tests.program_mutants import NUMBERS, leaves, payloads, set_at
from tuner.contract.errors import FxtuneError
from tuner.graph.capture import to_graph_module
from tuner.loading.bounds import load_bounded
from tuner.passes import get_pass, pass_names

EXAMPLES = int(os.environ.get("FXTUNE_FUZZ_EXAMPLES", "120"))
MEMORY_CAP_KB = 3 * 1024**2


@pytest.fixture(scope="module")
def bases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("fuzz")
    out = {}
    builds = (
        ("static", good_program),
        ("dynamic", dynamic_program),
        ("strings", strings_program_file),
    )
    for name, build in builds:
        path = build(root / f"{name}.pt2")
        with zipfile.ZipFile(path) as zf:
            member = next(n for n in zf.namelist() if n.endswith("models/model.json"))
            out[name] = (path, json.loads(zf.read(member)))
    return out


LITERAL_BREAKERS = ('"', "\\", "\n", "*/")


def _sites(path: Path) -> list[str]:
    """What `fxtune sites` runs on a file; the strings the loaded graph passes to operators."""
    gm = to_graph_module(load_bounded(path))
    for name in pass_names():
        get_pass(name).find_sites(gm)
    return [a for n in gm.graph.nodes for a in (*n.args, *n.kwargs.values()) if isinstance(a, str)]


counts = {"cases": 0, "refused": 0, "clean": 0}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_mutant_runs_code_or_escapes_fxtunes_errors(
    bases: dict[str, tuple[Path, dict[str, Any]]], tmp_path: Path, data: st.DataObject
) -> None:
    base_name = data.draw(st.sampled_from(sorted(bases)))
    src, program = bases[base_name]
    mutant = json.loads(json.dumps(program))
    marker = tmp_path / "marker"
    spots = [(p, v) for p, v in leaves(program) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        path, old = data.draw(st.sampled_from(spots))
        if isinstance(old, str):
            value = data.draw(st.sampled_from(payloads(marker)))
        else:
            value = data.draw(st.sampled_from(NUMBERS + payloads(marker)[:3]))
        try:
            set_at(mutant, path, value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced the parent
    dst = tmp_path / f"mutant-{counts['cases']}.pt2"
    raw = json.dumps(mutant).encode()
    rewrite(src, dst, lambda n, d: raw if n.endswith("models/model.json") else d)
    counts["cases"] += 1
    try:
        strings = _sites(dst)
        counts["clean"] += 1
        assert not [s for s in strings if any(b in s for b in LITERAL_BREAKERS)], strings
    except FxtuneError:
        counts["refused"] += 1
    assert not marker.exists(), f"a mutant ran code: {path}"
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert peak_kb < MEMORY_CAP_KB, f"memory reached {peak_kb // 1024} MiB"


def test_zz_the_fuzzer_ran_and_refused_most(capsys: pytest.CaptureFixture[str]) -> None:
    """Named to run after the fuzzer: it really ran, and most payloads were refused."""
    with capsys.disabled():
        print(f"\nfuzz: {counts}")
    if counts["cases"]:
        assert counts["refused"] > counts["cases"] // 2
