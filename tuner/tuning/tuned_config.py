"""The run's record: the tuned config (`tuner.contract.config.TunedConfig`) of what was chosen,
every decision and figure behind it, and how the run spent its budget."""

from __future__ import annotations

import dataclasses
import time

from tuner.backends.runtimes import RUNTIMES, installed_runtimes, is_runtime
from tuner.contract.config import Figures, Mode, TunedConfig
from tuner.search.site_search import SearchResult
from tuner.tuning.measured_under import fallback_of, measured_under, runtime_artifact
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
    runtime = is_runtime(chosen.backend)
    has_sites = any(d.accepted for d in search.decisions)
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
            # The original's call as read before planning (CPU): what checks are budgeted by.
            "call_s": run.model_time_s,
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
            "runtimes": runtimes_note(run, mode),
        },
        shapes=captured.spec.to_dict() if captured.spec is not None else {},
        refusals=search.refusals,
        runtime=runtime_artifact(chosen.backend),
        fallback=fallback_of(figures) if runtime else None,
        measured_under=measured_under(figures, chosen.backend, has_sites),
    )


def runtimes_note(run: TuningRun, mode: Mode) -> dict[str, str]:
    """Per runtime (OpenVINO, ONNX Runtime): its version where this run could build it, else
    why it was not a candidate (not installed, not this device, a training step)."""
    found = installed_runtimes()
    wanted = run.backends()
    note: dict[str, str] = {}
    for name, runtime in RUNTIMES.items():
        if name not in found:
            note[name] = f"not installed ({runtime.install_hint()})"
        elif run.device.kind != "cpu":
            note[name] = f"not offered: it runs on the CPU, this run on {run.device.kind}"
        elif mode != "infer":
            note[name] = "not offered: a training step (the runtimes run inference only)"
        elif name not in wanted:
            note[name] = f"{found[name]}, not among the backends asked for"
        else:
            note[name] = found[name]
    return note


def _by_step(spent: dict[str, float], seconds: float) -> dict[str, float]:
    steps = {step: round(s, 2) for step, s in spent.items()}
    steps["other"] = round(max(seconds - sum(spent.values()), 0.0), 2)
    return steps
