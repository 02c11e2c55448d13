"""What each dashboard page shows, built from the store: plain data the templates only lay out.

A figure the profiler could not measure is shown as "n/a (why)", never as a zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from service.dashboard import format as fmt
from service.rows import (
    MAX_MODELS,
    Row,
    candidate_rows,
    config_row,
    model_rows,
    rank_rows,
    site_rows,
    size_rows,
)
from service.store import AbstractStore, ConfigSummary, Job, Model, NotFound, StoredConfig
from tuner.contract.training import PHASES

API = "/api/v1"
RECENT_JOBS = 20
HOST_OVERHEAD = "host overhead (outside ops)"

FIGURES: tuple[tuple[str, str, Callable[[Any], str]], ...] = (
    ("ops_per_iter", "ATen ops per iteration", fmt.count),
    ("kernels_per_iter", "kernels per iteration", fmt.count),
    ("wall_us_per_iter", "wall time per iteration", fmt.duration_us),
    ("cpu_dispatch_overhead_us", "CPU dispatch overhead per iteration", fmt.duration_us),
    ("device_idle_us", "device idle per iteration", fmt.duration_us),
    ("peak_memory_bytes", "peak memory", fmt.size_bytes),
)


@dataclass(frozen=True)
class Figure:
    value: float | None
    text: str


@dataclass(frozen=True)
class FigureRow:
    key: str
    label: str
    baseline: Figure
    tuned: Figure
    change: str


@dataclass(frozen=True)
class Link:
    label: str
    url: str
    note: str = ""


@dataclass(frozen=True)
class Breakdown:
    """Baseline vs tuned profile: per-iteration figures and time by category."""

    device: str | None
    figures: list[FigureRow]
    categories: list[FigureRow]
    chart: dict[str, Any] | None
    phases: list[FigureRow] = field(default_factory=list)  # a training step's phases


@dataclass(frozen=True)
class ModelPage:
    model: Model
    configs: list[ConfigSummary]
    jobs: list[Job]
    selected: ConfigSummary | None = None
    overview: Row | None = None
    config: dict[str, Any] = field(default_factory=dict)
    sites: list[Row] = field(default_factory=list)
    candidates: list[Row] = field(default_factory=list)
    sizes: list[Row] = field(default_factory=list)  # per size, for dynamic programs
    ranks: list[Row] = field(default_factory=list)  # per rank, for distributed jobs
    breakdown: Breakdown | None = None
    downloads: list[Link] = field(default_factory=list)
    training: Row | None = None  # a training config's step and its figure over torch.compile


def missing_reason(summary: Mapping[str, Any], key: str) -> str | None:
    prefix = f"{key}: "
    return next(
        (m[len(prefix) :] for m in summary.get("missing", []) if m.startswith(prefix)), None
    )


def figure(summary: Mapping[str, Any] | None, key: str, show: Callable[[Any], str]) -> Figure:
    if summary is None:
        return Figure(None, f"{fmt.NA} (no profile was taken)")
    value = summary.get(key)
    if value is None:
        reason = missing_reason(summary, key) or "not recorded"
        return Figure(None, f"{fmt.NA} ({reason})")
    return Figure(float(value), show(value))


def change(baseline: Figure, tuned: Figure) -> str:
    if baseline.value is None or tuned.value is None or baseline.value == 0:
        return ""
    return f"{(tuned.value - baseline.value) / baseline.value:+.0%}"


def _row(key: str, label: str, base: Figure, tuned: Figure) -> FigureRow:
    return FigureRow(key, label, base, tuned, change(base, tuned))


def _category(summary: Mapping[str, Any] | None, name: str) -> Figure:
    if summary is None:
        return Figure(None, f"{fmt.NA} (no profile was taken)")
    value = (summary.get("time_by_category_us") or {}).get(name)
    if value is None:
        return Figure(None, f"{fmt.NA} (not recorded)")
    return Figure(float(value), fmt.duration_us(value))


def breakdown(profiles: Mapping[str, Mapping[str, Any]]) -> Breakdown | None:
    """MAIProf / HTA style comparison of the two profiles the tuner took."""
    base, tuned = profiles.get("baseline"), profiles.get("tuned")
    if base is None and tuned is None:
        return None
    figures = [
        _row(key, label, figure(base, key, show), figure(tuned, key, show))
        for key, label, show in FIGURES
    ]
    names: list[str] = []
    for summary in (base, tuned):
        for name in (summary or {}).get("time_by_category_us") or {}:
            if name not in names:
                names.append(name)
    categories = [_row(n, n, _category(base, n), _category(tuned, n)) for n in names]
    device = (base or tuned or {}).get("device")
    chart = _breakdown_chart(device, categories, figures)
    return Breakdown(device, figures, categories, chart, phase_rows(base, tuned))


PHASE_FIGURES = (
    ("wall_us_per_iter", "time", fmt.duration_us),
    ("op_calls_per_iter", "op events", fmt.count),
    ("kernels_per_iter", "kernels", fmt.count),
)


def _phase(summary: Mapping[str, Any] | None, phase: str, key: str, show: Any) -> Figure:
    value = ((summary or {}).get("phases") or {}).get(phase, {}).get(key)
    if value is None:
        return Figure(None, f"{fmt.NA} (not recorded)")
    return Figure(float(value), show(value))


def phase_rows(base: Mapping[str, Any] | None, tuned: Mapping[str, Any] | None) -> list[FigureRow]:
    """A training step's forward, backward and optimizer step, original against tuned: where
    a fusion's saving lands (a fused forward also has a fused backward)."""
    phases = [p for p in PHASES if any(p in ((s or {}).get("phases") or {}) for s in (base, tuned))]
    rows = []
    for phase in phases:
        for key, label, show in PHASE_FIGURES:
            pair = (_phase(base, phase, key, show), _phase(tuned, phase, key, show))
            if pair[0].value is not None or pair[1].value is not None:
                rows.append(_row(f"{phase}.{key}", f"{phase}: {label}", *pair))
    return rows


def _breakdown_chart(
    device: str | None, categories: list[FigureRow], figures: list[FigureRow]
) -> dict[str, Any] | None:
    """Stacked bars, one per profile. On CPU the host time outside ops completes the iteration;
    on CUDA categories are device time and launch overhead overlaps them, so it is left out."""
    datasets = [
        {"label": c.label, "data": [c.baseline.value, c.tuned.value]}
        for c in categories
        if c.baseline.value or c.tuned.value
    ]
    overhead = next(f for f in figures if f.key == "cpu_dispatch_overhead_us")
    if device == "cpu" and (overhead.baseline.value or overhead.tuned.value):
        data = [overhead.baseline.value, overhead.tuned.value]
        datasets.append({"label": HOST_OVERHEAD, "data": data})
    if not datasets:
        return None
    return {"labels": ["baseline", "tuned"], "datasets": datasets, "unit": "µs per iteration"}


def hardware_label(row: Row) -> str:
    parts = [row["device"], row.get("hardware") or row["hardware_key"]]
    if row.get("threads") is not None:
        parts.append(f"{row['threads']} threads")
    return " · ".join(str(p) for p in parts)


def mode_label(mode: str) -> str:
    """What the figures of a config are per: a call (inference) or a training step."""
    return "training" if mode == "train" else "inference"


def tab_label(summary: ConfigSummary) -> str:
    label = key_label(summary.hardware_key)
    return label if summary.mode == "infer" else f"{label} · {mode_label(summary.mode)}"


def training_view(config: Mapping[str, Any]) -> Row | None:
    """The step a training config was tuned for, and the shipped step over torch.compile of
    the original's step (the reference seed 002 measures against)."""
    if config.get("mode") != "train":
        return None
    setup = config.get("training") or {}
    versus = (config.get("tuning") or {}).get("versus_compile") or {}
    low, high = (versus.get("ci") or [None, None])[:2]
    return {
        "optimizer": setup.get("optimizer"),
        "loss": setup.get("loss"),
        "versus_compile": versus.get("speedup"),
        "versus_compile_ci": (low, high),
        "versus_compile_verdict": versus.get("verdict"),
        "versus_compile_reason": versus.get("reason"),
    }


def key_label(key: str) -> str:
    """`cpu|AMD EPYC|torch2.13.0|t2` as people read it."""
    parts = key.split("|")
    if len(parts) != 4:
        return key
    device, name, torch, threads = parts
    version = torch.removeprefix("torch")
    return f"{device} · {name} · {threads.removeprefix('t')} threads · torch {version}"


def shipped_speedup(row: Row) -> float | None:
    """What deployments get: the original is 1x by definition."""
    return 1.0 if row["original_kept"] else row["speedup"]


def speedup_chart(rows: Sequence[Row]) -> dict[str, Any] | None:
    """Grouped bars: one group per model, one bar per hardware it was tuned on."""
    if not rows:
        return None
    labels: list[str] = []
    model_index: dict[int, int] = {}
    for r in rows:
        if r["model_id"] not in model_index:
            model_index[r["model_id"]] = len(labels)
            labels.append(f"{r['model']} (#{r['model_id']})")
    datasets: dict[str, dict[str, Any]] = {}
    for r in rows:
        training = r.get("mode") == "train"
        ds = datasets.setdefault(
            f"{r['hardware_key']}|{r.get('mode', 'infer')}",
            {
                "label": hardware_label(r) + (" · training step" if training else ""),
                "data": [None] * len(labels),
                "ci": [None] * len(labels),
                "verdict": [None] * len(labels),
            },
        )
        i = model_index[r["model_id"]]
        ds["data"][i] = shipped_speedup(r)
        ds["ci"][i] = fmt.interval((r["ci_low"], r["ci_high"]))
        ds["verdict"][i] = "original kept" if r["original_kept"] else r["verdict"]
    return {"labels": labels, "datasets": list(datasets.values())}


def _query(summary: ConfigSummary, **extra: str) -> str:
    target = {"device": summary.device, "hardware": summary.hardware_key}
    if summary.mode != "infer":
        target["mode"] = summary.mode
    return urlencode({**target, **extra})


def downloads(tuned: StoredConfig) -> list[Link]:
    s = tuned.summary
    base = f"{API}/models/{s.model_id}"
    links = [
        Link("tuned config (JSON)", f"{base}/config?{_query(s)}", "what deployments fetch"),
        Link("tuned program (.pt2)", f"{base}/artifact?{_query(s)}", "torch.export.load"),
    ]
    if tuned.aoti_sha256:
        links.append(
            Link(
                "AOTInductor package",
                f"{base}/artifact?{_query(s, format='aoti')}",
                "torch._inductor.aoti_load_package",
            )
        )
    for p in tuned.profiles:
        if p.trace_sha256:
            links.append(
                Link(
                    f"{p.kind} trace (JSON)",
                    f"{base}/trace?{_query(s, kind=p.kind)}",
                    "open in ui.perfetto.dev or chrome://tracing",
                )
            )
    links.append(Link("full report (JSON)", f"{base}/report?{_query(s)}", "decisions, profiles"))
    links.append(Link("site decisions (CSV)", f"{base}/sites.csv?{_query(s)}", "pandas, sheets"))
    return links


def worker_rows(jobs: list[Job]) -> list[Row]:
    """The workers seen in the recent jobs, newest first, with the sandbox each declared: an
    operator who chose FXTUNE_WORKER_SANDBOX=none shows here as unsandboxed."""
    rows: dict[str, Row] = {}
    for job in sorted(jobs, key=lambda j: j.updated_at, reverse=True):
        if job.worker_id is None or job.worker_id in rows:
            continue
        hardware = job.worker_hardware or {}
        rows[job.worker_id] = {
            "worker": job.worker_id,
            "device": job.device,
            "hardware": str(hardware.get("name") or hardware.get("key") or ""),
            "sandbox": job.worker_sandbox,
            "job_id": job.id,
            "seen": job.updated_at,
        }
    return list(rows.values())


def index_rows(store: AbstractStore) -> tuple[list[Model], list[Row], list[Job]]:
    models = store.list_models(MAX_MODELS)
    return models, model_rows(store, models), store.list_jobs(limit=RECENT_JOBS)


def _pick(
    configs: list[ConfigSummary], device: str | None, hardware: str | None, mode: str | None
) -> ConfigSummary:
    """The asked-for config, else the newest; NotFound when the model has none that matches."""
    matching = [
        c
        for c in configs
        if device in (None, c.device)
        and hardware in (None, c.hardware_key)
        and mode in (None, c.mode)
    ]
    if not matching:
        raise NotFound(f"no tuned config for device={device} hardware={hardware} mode={mode}")
    return max(matching, key=lambda c: (c.updated_at, c.id))


def model_page(
    store: AbstractStore,
    model_id: int,
    device: str | None = None,
    hardware: str | None = None,
    mode: str | None = None,
) -> ModelPage:
    model = store.get_model(model_id)
    configs = store.list_configs([model_id])
    jobs = store.list_jobs(model_id=model_id, limit=RECENT_JOBS)
    if not configs and device is None and hardware is None and mode is None:
        return ModelPage(model, configs, jobs)
    chosen = _pick(configs, device, hardware, mode)
    tuned = store.get_config(
        model_id, chosen.device, chosen.hardware_key, details=True, mode=chosen.mode
    )
    return ModelPage(
        model=model,
        configs=configs,
        jobs=jobs,
        selected=chosen,
        overview=config_row(model, chosen, tuned.config),
        config=tuned.config,
        sites=site_rows(tuned.config),
        candidates=candidate_rows(tuned.config),
        sizes=size_rows(tuned.config),
        ranks=rank_rows(tuned.config),
        breakdown=breakdown({p.kind: p.summary for p in tuned.profiles}),
        downloads=downloads(tuned),
        training=training_view(tuned.config),
    )
