"""Tuning results as flat rows, computed once for the dashboard's tables and the CSV exports.

It sits below both the API and the dashboard, so neither imports the other.

Rows come from the stored tuned config (the contract), so a page, a CSV and the API's JSON can
never disagree about a number.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from service.store import AbstractStore, ConfigSummary, Model

ORIGINAL = "original"  # the whole-model "candidate" the tuner ships when nothing beat it
MAX_MODELS = 1000
TIMES = "\u00d7"  # the multiplication sign, as in "2.50x" (ruff flags it literally)

Row = dict[str, Any]


def _bounds(ci: Sequence[float | None] | None) -> tuple[float | None, float | None]:
    return (ci[0], ci[1]) if ci else (None, None)


def time_saved_s(site: Mapping[str, Any]) -> float | None:
    """Per call of the whole model: every identical site saves the same time."""
    base, cand = site.get("baseline_s"), site.get("candidate_s")
    if base is None or cand is None:
        return None
    return (base - cand) * site.get("count", 1)


def site_rows(config: Mapping[str, Any]) -> list[Row]:
    """Every site decision, accepted or not, the biggest saving first (unmeasured ones last)."""
    rows = []
    for s in config.get("sites", []):
        low, high = _bounds(s.get("ci"))
        rows.append(
            {
                "pass": s["pass"],
                "site_id": s["site_id"],
                "summary": s.get("summary", ""),
                "count": s.get("count", 1),
                "baseline_s": s.get("baseline_s"),
                "candidate_s": s.get("candidate_s"),
                "speedup": s.get("speedup"),
                "ci_low": low,
                "ci_high": high,
                "rounds": s.get("rounds", 0),
                "time_saved_s": time_saved_s(s),
                "verdict": s["verdict"],
                "accepted": bool(s["accepted"]),
                "cached": bool(s.get("cached", False)),
                "reason": s.get("reason"),
            }
        )
    return sorted(rows, key=lambda r: (r["time_saved_s"] is None, -(r["time_saved_s"] or 0.0)))


def _passes_text(passes: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{p['pass']} {TIMES}{len(p['sites'])}" for p in passes) or "none"


def candidate_rows(config: Mapping[str, Any]) -> list[Row]:
    """The whole-model candidates (eager, inductor, with or without passes); one is chosen."""
    chosen = config["whole_model"]["name"]
    rows = []
    for c in config.get("candidates", []):
        low, high = _bounds(c.get("ci"))
        rows.append(
            {
                "name": c["name"],
                "backend": c["backend"],
                "passes": _passes_text(c.get("passes", [])),
                "baseline_s": c.get("baseline_s"),
                "candidate_s": c.get("candidate_s"),
                "speedup": c.get("speedup"),
                "ci_low": low,
                "ci_high": high,
                "rounds": c.get("rounds", 0),
                "verdict": c["verdict"],
                "reason": c.get("reason"),
                "chosen": c["name"] == chosen,
            }
        )
    return rows


def _bucket_of(buckets: list[Mapping[str, Any]], sizes: Mapping[str, int]) -> Mapping | None:
    for b in buckets:
        size = sizes.get(b["dim"])
        if size is not None and size >= b["min"] and (b["max"] is None or size <= b["max"]):
            return b
    return None


def _bucket_label(b: Mapping[str, Any]) -> str:
    top = "∞" if b["max"] is None else b["max"]
    return f"{b['dim']} in [{b['min']}, {top}]"


def size_rows(config: Mapping[str, Any]) -> list[Row]:
    """Per size a dynamic program was tuned at: each candidate's figures there (chosen first).

    With size buckets, "chosen" is the decision of the bucket the size falls in, and each row
    names that bucket."""
    chosen = config["whole_model"]["name"]
    buckets = config.get("buckets") or []
    candidates = sorted(config.get("candidates", []), key=lambda c: c["name"] != chosen)
    rows = []
    for c in candidates:
        for f in c.get("per_size") or []:
            low, high = _bounds(f.get("ci"))
            bucket = _bucket_of(buckets, f.get("sizes") or {})
            picked = bucket["name"] if bucket is not None else chosen
            rows.append(
                {
                    "candidate": c["name"],
                    "size": f["label"],
                    "bucket": _bucket_label(bucket) if bucket is not None else None,
                    "bucket_decision": bucket["name"] if bucket is not None else None,
                    "baseline_s": f.get("baseline_s"),
                    "candidate_s": f.get("candidate_s"),
                    "speedup": f.get("speedup"),
                    "ci_low": low,
                    "ci_high": high,
                    "verdict": f.get("verdict"),
                    "reason": f.get("reason"),
                    "chosen": c["name"] == picked,
                }
            )
    return rows


FIGURE_5 = (
    "sequential_step_us",
    "overlapped_step_us",
    "comm_alone_us",
    "compute_us",
    "hidden_by_step_time_us",
    "hidden_by_step_time_share",
)


def rank_rows(config: Mapping[str, Any]) -> list[Row]:
    """A distributed config's figure 5 (overlap of the all-to-all with compute): the slowest
    rank first, then every rank, each with its own medians of the sites' lockstep A/B."""
    section = config.get("distributed") or {}
    profile = section.get("overlap_profile") or {}
    if "per_rank" not in profile:
        return []
    per_site = [f for f in (section.get("sites_per_rank") or {}).values() if f]
    slowest = {k: profile["slowest_rank"].get(k) for k in FIGURE_5}
    rows = [{"rank": "slowest", **slowest, "sites": None, "site_baseline_us": []}]
    for rank, figures in enumerate(profile["per_rank"]):
        mine = [site[rank] for site in per_site if rank < len(site)]
        rows.append(
            {
                "rank": str(rank),
                **{k: figures.get(k) for k in FIGURE_5},
                "sites": len(mine),
                "site_baseline_us": [m.get("baseline_median_us") for m in mine],
                "site_candidate_us": [m.get("candidate_median_us") for m in mine],
            }
        )
    return rows


def config_row(model: Model, summary: ConfigSummary, config: Mapping[str, Any]) -> Row:
    """One tuned config (model x device x mode x hardware) as the dashboard's overview shows
    it; a training config's figures are per training step."""
    whole = config["whole_model"]
    training = config.get("training") or {}
    hardware = config.get("hardware", {})
    low, high = _bounds(whole.get("ci"))
    sites = config.get("sites", [])
    return {
        "model_id": model.id,
        "model": model.name,
        "device": summary.device,
        "mode": summary.mode,
        "optimizer": training.get("optimizer"),
        "hardware_key": summary.hardware_key,
        "hardware": hardware.get("name"),
        "threads": hardware.get("threads"),
        "torch": hardware.get("torch"),
        "backend": config.get("backend"),
        "chosen": whole["name"],
        "original_kept": whole["name"] == ORIGINAL,
        "verdict": whole["verdict"],
        "speedup": whole.get("speedup"),
        "ci_low": low,
        "ci_high": high,
        "baseline_s": whole.get("baseline_s"),
        "candidate_s": whole.get("candidate_s"),
        "sites": len(sites),
        "sites_accepted": sum(1 for s in sites if s["accepted"]),
        "verified": config.get("verification", {}).get("passed"),
        "fingerprint": summary.fingerprint,
        "world_size": (config.get("distributed") or {}).get("world_size", 1),
        "rank": (config.get("distributed") or {}).get("rank"),
        "job_id": summary.job_id,
        "updated_at": summary.updated_at.isoformat(),
    }


def model_rows(store: AbstractStore, models: Sequence[Model] | None = None) -> list[Row]:
    """A row per tuned config of every model (newest model first; devices in name order,
    inference before training)."""
    models = store.list_models(MAX_MODELS) if models is None else models
    by_id = {m.id: m for m in models}
    rows = []
    for summary in store.list_configs(list(by_id)):
        tuned = store.get_config(
            summary.model_id, summary.device, summary.hardware_key, mode=summary.mode
        )
        rows.append(config_row(by_id[summary.model_id], summary, tuned.config))
    order = {m.id: i for i, m in enumerate(models)}
    return sorted(
        rows, key=lambda r: (order[r["model_id"]], r["device"], r["mode"], r["hardware_key"])
    )
