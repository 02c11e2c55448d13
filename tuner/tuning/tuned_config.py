"""The run's record: the tuned config (`tuner.contract.config.TunedConfig`) of what was chosen,
every decision and figure behind it, and how the run spent its budget."""

from __future__ import annotations

import dataclasses
import time

from tuner.contract.config import Figures, Mode, TunedConfig
from tuner.search.site_search import SearchResult
from tuner.tuning.run import Captured, TuningRun, Verified


def tuned_config(
    run: TuningRun,
    mode: Mode,
    fingerprint: str,
    captured: Captured,
    search: SearchResult,
    figures: list[Figures],
    verified: Verified,
) -> TunedConfig:
    chosen = verified.candidate
    seconds = time.monotonic() - run.started
    return TunedConfig(
        mode=mode,
        model_fingerprint=fingerprint,
        hardware=run.hardware,
        backend=chosen.backend,
        passes=chosen.passes,
        changes_inputs=bool(chosen.transformed.packers),
        sites=search.decisions,
        candidates=figures,
        whole_model=verified.figures,
        verification=verified.verification,
        tuning={
            "seconds": round(seconds, 2),
            # Where they went (`TuningRun.clocked`); "other": planning, profiles, choosing.
            "seconds_by_step": _by_step(run.spent, seconds),
            "budget_s": run.options.budget_s,
            # Other work on the cores as the run began; compile estimates were scaled by it.
            "load": {
                **dataclasses.asdict(run.load),
                "slowdown": round(run.load.slowdown, 2),
                "child_slowdown": round(run.load.child_slowdown, 2),
            },
            # What the CPU timings measured: "wall", or "cpu" (one thread beside other work).
            "clock": run.clock,
            "timed_candidates": run.timed,
            "cache_hits": run.cache.hits,
            # Why stored decisions were not used (`tuner.search.decisions`); empty: all were.
            "cache_ignored": run.cache.ignored,
            "sites_found": sum(len(s.sites) for s in search.every_site),
            "site_counts": search.counts(),
            "peers": run.peer_notes,
            "epsilon": run.options.epsilon,
            "sizes": [{"label": p.label, "sizes": p.sizes} for p in run.points],
            "sizes_skipped": captured.skipped,
        },
        shapes=captured.spec.to_dict() if captured.spec is not None else {},
        refusals=search.refusals,
    )


def _by_step(spent: dict[str, float], seconds: float) -> dict[str, float]:
    steps = {step: round(s, 2) for step, s in spent.items()}
    steps["other"] = round(max(seconds - sum(spent.values()), 0.0), 2)
    return steps
