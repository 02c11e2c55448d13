"""Pass versions cover the helpers a pass runs and the torch version, so cached decisions
measured under other code are not reused."""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import tuner.passes.source_digest
from tests.tuner.tuning_fixtures import ReluNet, SlowRelu, registered
from tuner.contract.config import SiteDecision, Verdict
from tuner.graph.capture import export_module, to_graph_module
from tuner.passes import get_pass
from tuner.passes.base import _code_digest
from tuner.passes.source_digest import module_closure, source_digest
from tuner.search.decisions import DecisionCache, DecisionKey, JsonDecisionCache
from tuner.search.site_search import SearchResult, SearchSettings, SiteSearch


@pytest.fixture(autouse=True)
def fresh_digests() -> Iterator[None]:
    _code_digest.cache_clear()
    yield
    _code_digest.cache_clear()


def _edited(monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    """Sources as if a file ending in `suffix` had been fixed (nothing on disk changes)."""
    read = tuner.passes.source_digest._read
    monkeypatch.setattr(
        tuner.passes.source_digest,
        "_read",
        lambda p: read(p) + (b"\n# fixed\n" if str(p).endswith(suffix) else b""),
    )
    _code_digest.cache_clear()


@pytest.mark.parametrize(
    "helper", ["tuner/graph/nodes.py", "tuner/graph/sites.py", "tuner/passes/base.py"]
)
def test_a_fix_in_a_shared_helper_changes_the_version(
    helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fold = type(get_pass("fold_conv_bn"))
    before = fold.version()
    _edited(monkeypatch, helper)
    assert fold.version() != before


def test_code_the_pass_does_not_import_leaves_it_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    fold = type(get_pass("fold_conv_bn"))
    before = fold.version()
    _edited(monkeypatch, "tuner/measure/timing.py")
    assert fold.version() == before
    assert "tuner.measure.timing" not in module_closure(fold.__module__, ("tuner",))


def test_imports_are_followed_transitively_and_inside_functions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "fxt_digest_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "deep.py").write_text("K = 1\n")
    (pkg / "helpers.py").write_text("from fxt_digest_pkg.deep import K\n")
    (pkg / "lazy.py").write_text("L = 1\n")
    (pkg / "mypass.py").write_text(
        "from . import helpers\n\ndef run():\n    from fxt_digest_pkg import lazy\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    name, packages = "fxt_digest_pkg.mypass", ("fxt_digest_pkg",)
    assert set(module_closure(name, packages)) == {
        "fxt_digest_pkg",
        "fxt_digest_pkg.deep",
        "fxt_digest_pkg.helpers",
        "fxt_digest_pkg.lazy",
        "fxt_digest_pkg.mypass",
    }
    first = source_digest(name, packages)
    for module in ("deep.py", "lazy.py"):
        (pkg / module).write_text("K = L = 2\n")
        assert source_digest(name, packages) != first
    sys.modules.pop("fxt_digest_pkg", None)


def test_another_torch_version_changes_the_version(monkeypatch: pytest.MonkeyPatch) -> None:
    fold = type(get_pass("fold_conv_bn"))
    before = fold.version()
    monkeypatch.setattr(torch, "__version__", "2.0.0+elsewhere")
    assert fold.version() != before


def _search(cache: DecisionCache) -> SearchResult:
    inputs = (torch.randn(256, 64),)
    gm = to_graph_module(export_module(ReluNet().eval(), inputs))
    settings = SearchSettings(passes=["test_slow_relu"], site_budget_s=0.5, hardware_key="test")
    return SiteSearch(settings, cache).run(copy.deepcopy(gm), inputs)


def test_a_cache_from_another_torch_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytorch#150494: a cache written under another torch version crashed a run."""
    path = tmp_path / "decisions.json"
    with registered(SlowRelu):
        current = SlowRelu.version()
        with monkeypatch.context() as m:
            m.setattr(torch, "__version__", "2.0.0+elsewhere")
            _code_digest.cache_clear()
            other = SlowRelu.version()
        _code_digest.cache_clear()
        assert other != current
        # What that torch's fxtune cached: a well-formed decision this one must not reuse.
        sites = SlowRelu().find_sites(to_graph_module(_relu_program()))
        old = {
            str(DecisionKey("test", "eager", other, s.id)): _faster(s.pass_name, s.id)
            for s in sites
        }
        path.write_text(json.dumps(old))
        cache = JsonDecisionCache(path)
        assert cache.ignored == []  # it loads: the version in the key keeps it out
        result = _search(cache)
    assert cache.hits == 0 and result.timed == 1
    assert result.decisions[0].verdict == "slower"
    # The control: under this torch's version, the same record is what the search uses.
    path.write_text(json.dumps({k.replace(other, current): v for k, v in old.items()}))
    with registered(SlowRelu):
        cache = JsonDecisionCache(path)
        result = _search(cache)
    assert cache.hits == 1 and result.timed == 0
    assert result.decisions[0].verdict == "faster"


def _faster(pass_name: str, site_id: str) -> dict:
    decision = SiteDecision(
        pass_name=pass_name,
        site_id=site_id,
        summary="relu",
        verdict=Verdict.FASTER,
        accepted=True,
        speedup=2.0,
        ci=(1.9, 2.1),
        rounds=10,
    )
    return decision.model_dump(mode="json", by_alias=True)


def _relu_program() -> torch.export.ExportedProgram:
    return export_module(ReluNet().eval(), (torch.randn(256, 64),))


@pytest.mark.parametrize("text", ["[1, 2]", '{"k": 3}', "null"])
def test_a_cache_file_of_another_shape_is_ignored(tmp_path: Path, text: str) -> None:
    path = tmp_path / "decisions.json"
    path.write_text(text)
    cache = JsonDecisionCache(path)
    assert cache.get(DecisionKey("h", "eager", "v", "k")) is None
    assert cache.ignored and "decisions.json" in cache.ignored[0]
