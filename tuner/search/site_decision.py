"""The one builder of a site's decision record (`tuner.contract.config.SiteDecision`).

The per-site search (`tuner.search.site_search`) and the distributed lockstep tuner
(`tuner.distributed.tune`) both decide sites; both build their records here, so a site is
"accepted" by one rule (its verdict is "faster") and its figures come from one summary
(`tuner.measure.timing.timing_fields`), whichever tuner measured it.
"""

from __future__ import annotations

from typing import Any

from tuner.contract.config import SiteDecision, Verdict
from tuner.measure.verdicts import Comparison, timing_fields


def site_decision(
    pass_name: str,
    site_id: str,
    summary: str,
    verdict: Verdict,
    comparison: Comparison | None = None,
    *,
    count: int = 1,
    **fields: Any,
) -> SiteDecision:
    """A site's decision: accepted exactly when `verdict` is faster; the timing figures are
    `comparison`'s (None: the site was not timed); `fields` are further `SiteDecision` fields
    (`reason`, `share`, ...)."""
    timing = timing_fields(comparison) if comparison is not None else {}
    return SiteDecision(
        pass_name=pass_name,
        site_id=site_id,
        summary=summary,
        count=count,
        verdict=verdict,
        accepted=verdict == Verdict.FASTER,
        **timing,
        **fields,
    )
