"""The decision store: typed records in memory or in a JSON file, and files written before the
records were typed (or by another program) either load or are ignored with a reason."""

from __future__ import annotations

import json
from pathlib import Path

from tuner.contract.config import SiteDecision, Verdict
from tuner.search.decisions import (
    DecisionKey,
    JsonDecisionCache,
    MemoryDecisionCache,
    open_decision_cache,
)

KEY = DecisionKey("cpu|x|8", "eager", "test_slow_relu@c2dfcf326d", "73cbd300493c896c")
# Entries as the untyped cache wrote them (the first copied from a file it wrote; the second
# a dynamic program's, with figures per size).
OLD_FILE = {
    "test::eager::test_slow_relu@c2dfcf326d::73cbd300493c896c": {
        "pass": "test_slow_relu",
        "site_id": "73cbd300493c896c",
        "summary": "relu relu",
        "count": 1,
        "verdict": "slower",
        "accepted": False,
        "baseline_s": 8.27663888888889e-06,
        "candidate_s": 0.0012567886666666668,
        "speedup": 0.008377498911221732,
        "ci": [0.004965496417583963, 0.013368073497986693],
        "rounds": 8,
    },
    "test::eager::fuse_horizontal_linear@1::abc@batch=1;batch=64": {
        "pass": "fuse_horizontal_linear",
        "site_id": "abc",
        "summary": "3 linears",
        "count": 2,
        "verdict": "faster",
        "accepted": True,
        "reason": None,
        "baseline_s": 2e-4,
        "candidate_s": 1e-4,
        "speedup": 2.0,
        "ci": [1.8, 2.2],
        "rounds": 12,
        "per_size": [
            {
                "label": "batch=1",
                "sizes": {"batch": 1},
                "baseline_s": 2e-4,
                "candidate_s": 1e-4,
                "speedup": 2.0,
                "ci": [1.8, 2.2],
                "rounds": 12,
                "verdict": "faster",
                "reason": None,
            },
            {
                "label": "batch=64",
                "sizes": {"batch": 64},
                "rounds": 0,
                "verdict": "within noise",
                "reason": None,
            },
        ],
    },
}


def _decision(verdict: Verdict = Verdict.FASTER, speedup: float = 1.5) -> SiteDecision:
    return SiteDecision(
        pass_name="p",
        site_id="s",
        summary="relu",
        verdict=verdict,
        accepted=verdict == Verdict.FASTER,
        speedup=speedup,
        ci=(speedup - 0.1, speedup + 0.1),
        rounds=10,
    )


def test_the_memory_store_serves_what_was_put_and_counts_hits() -> None:
    store = MemoryDecisionCache()
    assert store.get(KEY) is None and store.hits == 0
    store.put(KEY, _decision())
    got = store.get(KEY)
    assert got == _decision() and store.hits == 1
    other = DecisionKey(KEY.hardware, "compile", KEY.pass_version, KEY.site_id)
    assert store.get(other) is None and store.hits == 1  # the backend is part of the key
    got.count = 7  # the caller's copy: the store keeps what was put
    assert store.get(KEY) == _decision()


def test_the_file_store_keeps_decisions_across_runs(tmp_path: Path) -> None:
    path = tmp_path / "decisions.json"
    first = open_decision_cache(path)
    assert isinstance(first, JsonDecisionCache)
    first.put(KEY, _decision(Verdict.SLOWER, 0.5))
    second = open_decision_cache(path)
    assert second.get(KEY) == _decision(Verdict.SLOWER, 0.5) and second.ignored == []
    # On disk: the config's JSON of the record, under the key's text; verdicts as strings.
    raw = json.loads(path.read_text())
    assert raw[str(KEY)]["verdict"] == "slower" and raw[str(KEY)]["pass"] == "p"
    assert isinstance(open_decision_cache(None), MemoryDecisionCache)


def test_a_file_the_untyped_cache_wrote_loads_as_records(tmp_path: Path) -> None:
    path = tmp_path / "decisions.json"
    path.write_text(json.dumps(OLD_FILE))
    store = JsonDecisionCache(path)
    assert store.ignored == []
    first, second = (store.get(_key(k)) for k in OLD_FILE)
    assert first is not None and first.verdict is Verdict.SLOWER and not first.accepted
    assert first.ci == (0.004965496417583963, 0.013368073497986693)
    assert second is not None and second.accepted and second.count == 2
    assert [f.verdict for f in second.per_size] == [Verdict.FASTER, Verdict.WITHIN_NOISE]
    # Written back, each entry reads as it did: the values are the same JSON strings.
    store.put(KEY, _decision())
    again = json.loads(path.read_text())
    for k, entry in OLD_FILE.items():
        assert SiteDecision.model_validate(again[k]) == SiteDecision.model_validate(entry)


def test_entries_that_are_not_decisions_are_ignored_with_a_reason_and_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "decisions.json"
    foreign = {"other-tool::k": {"verdict": 7}, "k2": [1, 2]}
    path.write_text(json.dumps({**OLD_FILE, **foreign}))
    store = JsonDecisionCache(path)
    assert len(store.ignored) == 1 and "2 of 4 entries" in store.ignored[0]
    assert set(store.records()) == set(OLD_FILE)  # what is served
    store.put(KEY, _decision())
    kept = json.loads(path.read_text())
    assert {k: kept[k] for k in foreign} == foreign  # left as they were for their owner
    # The control: a file of only records has nothing to say.
    path.write_text(json.dumps(OLD_FILE))
    assert JsonDecisionCache(path).ignored == []


def test_an_unreadable_file_is_ignored_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "decisions.json"
    path.write_text("{not json")
    store = JsonDecisionCache(path)
    assert store.get(KEY) is None
    assert store.ignored == ["decisions.json could not be read (JSONDecodeError): not used"]
    store.put(KEY, _decision())  # and it is replaced by a readable one
    assert JsonDecisionCache(path).get(KEY) == _decision()


def _key(text: str) -> DecisionKey:
    hardware, backend, version, site = text.split("::")
    return DecisionKey(hardware, backend, version, site)


def test_why_stored_decisions_were_not_used_reaches_the_config(tmp_path: Path) -> None:
    import torch

    from tuner.search.site_search import SearchResult
    from tuner.tuning.choose import original
    from tuner.tuning.options import TuneOptions
    from tuner.tuning.run import Captured, TuningRun
    from tuner.tuning.tuned_config import tuned_config
    from tuner.tuning.verify import unchanged

    def config_of(path: Path) -> dict:
        run = TuningRun.open(TuneOptions(cache_path=path, workdir=tmp_path))
        gm = torch.fx.symbolic_trace(torch.nn.ReLU())
        captured = Captured(gm, (torch.randn(2),), None, [])
        fig, cand = original(captured, Verdict.WITHIN_NOISE, "nothing to do")
        verified = unchanged(captured, fig, cand, gm)
        search = SearchResult(gm, captured.inputs)
        return tuned_config(run, "infer", "f", captured, search, [fig], verified).tuning

    path = tmp_path / "decisions.json"
    path.write_text(json.dumps({**OLD_FILE, "k": {"verdict": 7}}))
    assert "1 of 3 entries of decisions.json" in config_of(path)["cache_ignored"][0]
    path.write_text(json.dumps(OLD_FILE))
    assert config_of(path)["cache_ignored"] == []
