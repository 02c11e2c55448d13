"""One rank's tuned config, read from a distributed job's report (`tuner.distributed.tune`).

The distributed report (`report_version` 1) is its own JSON; the service stores, serves and
shows tuned configs (`tuner.contract.config.TunedConfig`, the contract). So every rank gets a config
of that schema: its site decisions (the same on every rank: rank 0 decided), the replayable
`passes`, and as whole-model figures the lockstep A/B of the slowest rank. The world size and
the per-rank figures (figure 5 and the per-rank medians) travel in the config's `distributed`
section, which older readers ignore.

A report's sites are `SiteDecision` records with the report's own fields beside them
(`tuner.distributed.tune`); a report written before that carries only the report's fields
(`site`, `verdict` in its own wording, `comparison`), which are read into the same record.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from tuner.contract.config import Figures, PassStep, SiteDecision, TunedConfig, Verdict

REPORT_VERSION = 1
ORIGINAL = "original"  # the name the tuner gives the untouched program when nothing beat it
# Wording of reports written before sites were `SiteDecision`s -> the config's Verdict.
VERDICTS = {"outputs differ": Verdict.WRONG_OUTPUTS}


class DistributedReportError(ValueError):
    """The report is not what `fxtune tune --world-size N` writes."""


def _need(report: dict[str, Any], key: str, kind: type) -> Any:
    value = report.get(key)
    if not isinstance(value, kind):
        raise DistributedReportError(f"distributed report has no {kind.__name__} {key!r}")
    return value


def _site(pass_name: str, s: dict[str, Any]) -> SiteDecision:
    """A report's site as the config's record."""
    if "site_id" in s:
        return SiteDecision.model_validate(s)
    c = s.get("comparison") or {}
    return SiteDecision(
        pass_name=pass_name,
        site_id=str(s["site"]),
        summary=str(s.get("summary", "")),
        accepted=bool(s["accepted"]),
        verdict=VERDICTS.get(s["verdict"], s["verdict"]),
        baseline_s=c.get("baseline_median_s"),
        candidate_s=c.get("candidate_median_s"),
        speedup=c.get("speedup"),
        ci=(c["ci_low"], c["ci_high"]) if c else None,
        rounds=c.get("rounds", 0),
    )


def _whole(sites: list[SiteDecision], steps: list[PassStep]) -> Figures:
    """One measured site: its lockstep A/B is the whole program's (the only rewrite)."""
    accepted = any(s.accepted for s in sites)
    name = "overlap_comm_compute" if accepted else ORIGINAL
    figures = Figures(name=name, backend="eager", passes=steps, verdict=Verdict.NOT_MEASURED)
    measured = [s for s in sites if s.rounds]
    if len(measured) == 1:
        keys = {"baseline_s", "candidate_s", "speedup", "ci", "rounds", "verdict"}
        return figures.model_copy(update=measured[0].model_dump(include=keys))
    if accepted:  # every accepted site cleared its interval on its own
        return figures.model_copy(update={"verdict": Verdict.FASTER})
    return figures


def rank_config(report: dict[str, Any], rank: int) -> dict[str, Any]:
    """Rank `rank`'s tuned config (a `TunedConfig` with a `distributed` section)."""
    if report.get("report_version") != REPORT_VERSION:
        raise DistributedReportError(
            f"distributed report_version {report.get('report_version')!r} is not {REPORT_VERSION}"
        )
    world_size = _need(report, "world_size", int)
    if not 0 <= rank < world_size:
        raise DistributedReportError(f"rank {rank} is outside world size {world_size}")
    pass_name = _need(report, "pass", str)
    profile = _need(report, "overlap_profile", dict)
    raw_sites = _need(report, "sites", list)
    try:
        sites = [_site(pass_name, s) for s in raw_sites]
    except (KeyError, TypeError) as exc:
        raise DistributedReportError(f"distributed report site lacks {exc}") from None
    except ValidationError as exc:
        raise DistributedReportError(f"distributed report site is not a decision: {exc}") from None
    for what, per_rank in [("overlap_profile", profile.get("per_rank"))] + [
        (f"site {s.get('site')}", s["per_rank"]) for s in raw_sites if "per_rank" in s
    ]:
        if per_rank is not None and len(per_rank) != world_size:
            raise DistributedReportError(f"{what} has figures for {len(per_rank)} ranks")
    accepted = [s.site_id for s in sites if s.accepted]
    steps = [PassStep(pass_name=pass_name, sites=accepted)] if accepted else []
    whole = _whole(sites, steps)
    diffs = [s.get("max_abs_diff_this_rank") for s in raw_sites if s.get("comparison")]
    config = {
        "model_fingerprint": _need(report, "model_fingerprint", str),
        "hardware": _need(report, "hardware", dict),
        "backend": "eager",
        "passes": [p.model_dump(mode="json", by_alias=True) for p in steps],
        "sites": [s.model_dump(mode="json", by_alias=True) for s in sites],
        "whole_model": whole.model_dump(mode="json", by_alias=True),
        "candidates": [whole.model_dump(mode="json", by_alias=True)],
        "verification": {
            "inputs": (report.get("options") or {}).get("check_inputs", 0),
            # Rank 0's own worst difference (the report is rank 0's); every rank's check passed
            # for a measured site, since a failed check anywhere stops its timing everywhere.
            "max_abs_error": max(diffs) if diffs and rank == 0 else None,
            "max_rel_error": None,
            "passed": all(s.verdict != Verdict.WRONG_OUTPUTS for s in sites),
        },
        "tuning": {"seconds": report.get("seconds"), "options": report.get("options")},
        "distributed": {
            "report_version": REPORT_VERSION,
            "world_size": world_size,
            "rank": rank,
            "collective_backend": report.get("backend"),
            "threads_per_rank": report.get("threads_per_rank"),
            "overlap_profile": profile,
            "sites_per_rank": {str(s["site"]): s.get("per_rank") for s in raw_sites},
        },
    }
    try:
        TunedConfig.model_validate(config)
    except ValueError as exc:
        raise DistributedReportError(f"rank {rank}'s config is not a tuned config: {exc}") from None
    return config
