"""A distributed report becomes one TunedConfig per rank: same decisions, replayable passes,
the per-rank figures kept; a report that does not fit is refused, not half-stored."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tuner.contract.config import TunedConfig, Verdict
from tuner.distributed.config import DistributedReportError, rank_config
from tuner.distributed.tune import OUTPUTS_DIFFER
from tuner.measure.verdicts import Comparison, verdict
from tuner.search.site_decision import site_decision

FIGURES = {
    "sequential_step_us": 1300.0,
    "overlapped_step_us": 1100.0,
    "comm_alone_us": 330.0,
    "compute_us": 650.0,
    "hidden_by_step_time_us": 200.0,
    "hidden_by_step_time_share": 0.61,
}
COMPARISON = {
    "speedup": 1.18,
    "ci_low": 1.1,
    "ci_high": 1.25,
    "rounds": 40,
    "baseline_median_s": 0.0013,
    "candidate_median_s": 0.0011,
}
PER_RANK = [
    {"baseline_median_us": 1250.0, "candidate_median_us": 1050.0},
    {"baseline_median_us": 1300.0, "candidate_median_us": 1100.0},
]


def report(verdict: str = "faster", accepted: bool = True) -> dict[str, Any]:
    site = {
        "site": "s1",
        "accepted": accepted,
        "verdict": verdict,
        "summary": "a2a",
        "max_abs_diff_this_rank": 0.0,
        "comparison": dict(COMPARISON),
        "per_rank": copy.deepcopy(PER_RANK),
    }
    return {
        "report_version": 1,
        "pass": "overlap_comm_compute",
        "world_size": 2,
        "model_fingerprint": "f" * 32,
        "hardware": {"device": "cpu", "name": "cpu x", "torch": "2.13.0", "threads": 1},
        "backend": "gloo",
        "threads_per_rank": 1,
        "sites": [site],
        "accepted": ["s1"] if accepted else [],
        "overlap_profile": {"slowest_rank": FIGURES, "per_rank": [FIGURES, FIGURES]},
        "options": {"check_inputs": 3},
    }


def test_every_rank_gets_the_same_decision_and_its_own_rank() -> None:
    configs = [rank_config(report(), r) for r in range(2)]
    for rank, config in enumerate(configs):
        parsed = TunedConfig.model_validate(config)
        assert [(p.pass_name, p.sites) for p in parsed.passes] == [("overlap_comm_compute", ["s1"])]
        assert parsed.whole_model.name == "overlap_comm_compute"
        assert parsed.whole_model.speedup == 1.18 and parsed.whole_model.ci == (1.1, 1.25)
        assert config["distributed"]["rank"] == rank
        assert len(config["distributed"]["overlap_profile"]["per_rank"]) == 2
    assert configs[0]["sites"] == configs[1]["sites"]


def test_a_rejected_site_keeps_the_original_and_wrong_outputs_fail_verification() -> None:
    kept = TunedConfig.model_validate(rank_config(report("within noise", False), 0))
    assert kept.passes == [] and kept.whole_model.name == "original"
    wrong = report("outputs differ", False)
    del wrong["sites"][0]["comparison"], wrong["sites"][0]["per_rank"]
    config = TunedConfig.model_validate(rank_config(wrong, 1))
    assert config.sites[0].verdict == "wrong outputs" and not config.verification.passed


@pytest.mark.parametrize(
    "break_it",
    [
        lambda r: r.update(report_version=2),
        lambda r: r.pop("model_fingerprint"),
        lambda r: r["overlap_profile"]["per_rank"].pop(),
        lambda r: r["sites"][0]["per_rank"].pop(),
        lambda r: r["sites"][0].pop("site"),
    ],
)
def test_a_report_that_does_not_fit_is_refused(break_it: Any) -> None:
    broken = report()
    break_it(broken)
    with pytest.raises(DistributedReportError):
        rank_config(broken, 0)


def test_a_rank_outside_the_world_is_refused() -> None:
    with pytest.raises(DistributedReportError):
        rank_config(report(), 2)


def _lockstep_comparison() -> Comparison:
    base = [1.3e-3 + i * 1e-6 for i in range(20)]
    cand = [1.1e-3 + i * 1e-6 for i in range(20)]
    return Comparison(base, cand, 1.18, 1.1, 1.25, 20, "narrow")


def test_a_report_of_site_decisions_reads_as_an_old_report_does() -> None:
    """Sites are the search's `SiteDecision` records (with the old fields beside them); a report
    written before, with only the old fields, reads into the same config."""
    c = _lockstep_comparison()
    decision = site_decision("overlap_comm_compute", "s1", "a2a", verdict(c, 0.02), c)
    assert decision.verdict == Verdict.FASTER and decision.accepted
    old, new = report(), report()
    old["sites"][0]["comparison"] = c.to_dict()
    new["sites"][0] = decision.model_dump(mode="json", by_alias=True) | {
        "site": "s1",
        "max_abs_diff_this_rank": 0.0,
        "comparison": c.to_dict(),
        "per_rank": copy.deepcopy(PER_RANK),
    }
    old_config, new_config = rank_config(old, 0), rank_config(new, 0)
    assert new_config["sites"] == old_config["sites"]
    assert new_config["whole_model"] == old_config["whole_model"]
    assert TunedConfig.model_validate(new_config).sites[0] == decision
    # The control: a decision that differs from the old fields is what the config says.
    new["sites"][0]["speedup"] = 9.0
    assert rank_config(new, 0)["sites"][0]["speedup"] == 9.0 != old_config["sites"][0]["speedup"]


def test_a_site_whose_outputs_differ_is_a_wrong_outputs_decision() -> None:
    wrong = site_decision(
        "overlap_comm_compute", "s1", "a2a", Verdict.WRONG_OUTPUTS, reason=OUTPUTS_DIFFER
    )
    broken = report("x", False)
    broken["sites"][0] = wrong.model_dump(mode="json", by_alias=True) | {
        "site": "s1",
        "max_abs_diff_this_rank": 0.5,
    }
    config = TunedConfig.model_validate(rank_config(broken, 0))
    assert config.sites[0].reason == OUTPUTS_DIFFER and not config.verification.passed
    assert config.passes == [] and config.whole_model.name == "original"
    broken["sites"][0]["verdict"] = "outputs differ"  # not a Verdict: refused, not stored
    with pytest.raises(DistributedReportError, match="not a decision"):
        rank_config(broken, 0)
