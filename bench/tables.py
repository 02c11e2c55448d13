"""`make tables`: the README's and the docs' results tables and plot, from bench/out/.

Every benchmark writes one current JSON file (`bench.record`); this renders each table from
those files into the blocks marked in README.md and docs/*.md,

    <!-- results:NAME:start -->
    ...generated...
    <!-- results:NAME:end -->

and draws the `make bench` plot (docs/img/bench.png). `python -m bench.tables --check` changes
nothing and exits 1 where a committed block differs from what the files give (a test runs the
same check), so a figure in prose cannot disagree with its run. Imports neither torch nor the
benchmarks: it only reads JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.gpu_check import tables as gpu_tables

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
TARGETS = ("README.md", "docs/benchmarks.md", "docs/index.md")
PLOT = REPO / "docs" / "img" / "bench.png"
BLOCK = re.compile(
    r"(<!-- results:(?P<name>[a-z0-9-]+):start -->\n)(?P<body>.*?)(<!-- results:(?P=name):end -->)",
    re.S,
)
MARGIN_S = 15.0  # a run ends within its budget plus this (issue 19)
ZOO_PEERS = ("torch.compile", "AOTInductor")
# The CPU runtimes (issue 48): columns of their own where the rows measured them.
RUNTIME_PEERS = ("OpenVINO", "ONNX Runtime")
SHORT = {"OpenVINO": "OV", "ONNX Runtime": "ORT"}
GOAL_OVER_AOTI = 1.8  # issue 48: make bench's geomean over AOTInductor


def read(name: str, out: Path = OUT) -> dict[str, Any]:
    return json.loads((out / f"{name}.json").read_text())


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _ci(fig: dict[str, Any] | None) -> str:
    """A ratio with its 95% interval: `1.94x [1.90, 1.98]`."""
    if not fig or fig.get("speedup") is None:
        return "-"
    low, high = fig.get("ci_low"), fig.get("ci_high")
    if low is None or high is None:
        low, high = (fig.get("ci") or [None, None])[:2]
    interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
    return f"{fig['speedup']:.2f}x{interval}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def measured_on(doc: dict[str, Any]) -> str:
    """Where and when: `2 CPU cores (AMD EPYC), no GPU, torch 2.13.0+cpu; 2026-11-27, 44bed60`."""
    m, rec = doc["machine"], doc["recorded"]
    gpu = m.get("gpu") or "no GPU"
    return (
        f"{m['cores']} CPU cores ({m['cpu']}), {gpu}, torch {m['torch']}; "
        f"`{doc['command']}`, {rec['date']}, commit {rec['commit']}"
    )


# ------------------------------------------------------------------ make bench (bench.run)


def _static_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in doc["rows"] if "columns" in r]


def results_summary(out: Path = OUT) -> str:
    """The README's table: what fxtune ships against what a user would run instead."""
    doc = read("results", out)
    rows = _static_rows(doc)
    peers = [c for c in rows[0]["columns"] if c not in ("every pass (eager)",)][:-2]
    head = ["model", *peers, "fxtune", "fxtune / best peer", "fxtune chose", "tuning s"]
    body = [
        [
            r["model"],
            *(_x(r["ratios"][p]["speedup"]) for p in peers),
            _x(r["ratios"]["fxtune"]["speedup"]),
            _ci(r["vs_best_peer"]),
            r["chosen"],
            f"{r['tuning_s']:.0f}",
        ]
        for r in rows
    ]
    return f"Measured on {measured_on(doc)}.\n\n" + _table(head, body)


def results_full(out: Path = OUT) -> str:
    doc = read("results", out)
    rows = _static_rows(doc)
    cols = rows[0]["columns"]
    head = ["model", *cols, "best peer", "fxtune / best peer", "fxtune chose", "tuning s"]
    head.append("timed candidates")
    runtimes = any("self_check" in r for r in rows)  # issue 48's columns, where measured
    if runtimes:
        head += ["build s", "self-check"]
    body = []
    for r in rows:
        cells = [
            r["model"],
            *(_ci(r["ratios"].get(c)) for c in cols),
            r["best_peer"],
            _ci(r["vs_best_peer"]),
            r["chosen"],
            f"{r['tuning_s']:.0f}" + (f" / {r['budget_s']:.0f}" if "budget_s" in r else ""),
            str(r["timed_candidates"]),
        ]
        if runtimes:
            build = r.get("chosen_build_s")
            checks = r.get("self_check") or {}
            self_check = ", ".join(f"{SHORT.get(p, p)} {_ci(c)}" for p, c in checks.items())
            cells += ["-" if build is None else f"{build:.1f}", self_check or "-"]
        body.append(cells)
    return f"Measured on {measured_on(doc)}.\n\n" + _table(head, body)


def results_dynamic(out: Path = OUT) -> str:
    rows = [r for r in read("results", out)["rows"] if "batch" in r]
    head = ["model", "fxtune program (eager)", "fxtune", "fxtune chose", "tuned at"]
    body = [
        [
            r["model"],
            _ci(r["ratios"]["fxtune program (eager)"]),
            _ci(r["ratios"]["fxtune"]),
            r["chosen"],
            ", ".join(r["tuned_at"]),
        ]
        for r in rows
    ]
    return _table(head, body)


def results_roofline(out: Path = OUT) -> str:
    """Each model's compute floor (`bench.roofline`) beside the per-call times of AOTInductor and
    of what fxtune ships (each the median of its own comparison with eager): how close the
    shipped program runs to the floor, and the most any tuner could ship over AOTInductor on
    this machine in float32."""
    doc = read("results", out)
    rows = [r for r in _static_rows(doc) if "roofline" in r and "AOTInductor" in r["ratios"]]
    if not rows:
        return "No row of this run measured the floor (`make bench` on a CPU writes it).\n"
    head = [
        "model",
        "GEMM + conv GFLOP",
        "floor ms",
        "AOTInductor ms",
        "fxtune ms",
        "fxtune at % of floor",
        "ceiling over AOTInductor",
    ]
    body, shares, ceilings = [], [], []
    for r in rows:
        roof, fx, aoti = r["roofline"], r["ratios"]["fxtune"], r["ratios"]["AOTInductor"]
        shares.append(roof["floor_ms"] / fx["ms"])
        ceilings.append(aoti["ms"] / roof["floor_ms"])
        body.append(
            [
                r["model"],
                f"{roof['gflop']:.3f}",
                f"{roof['floor_ms']:.2f}",
                f"{aoti['ms']:.2f}",
                f"{fx['ms']:.2f}",
                f"{shares[-1]:.0%}",
                _x(ceilings[-1]),
            ]
        )
    share, ceiling = geomean(shares), geomean(ceilings)
    body.append(["geomean", "", "", "", "", f"{share:.0%}", _x(ceiling)])
    peak = rows[0]["roofline"]["peak_gflops"]
    return (
        f"Measured on {measured_on(doc)}; the floor at {peak:.0f} GFLOP/s, the fastest float32 "
        "`torch.mm` of the run.\n\n"
        + _table(head, body)
        + f"\n{GOAL_OVER_AOTI:.1f}x over AOTInductor (geomean) would take "
        + f"{GOAL_OVER_AOTI / ceiling:.0%} of the floor on average; what fxtune ships runs at "
        + f"{share:.0%}.\n"
    )


# ------------------------------------------------------------------------ the zoo (bench.zoo)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def zoo_table(rows: list[dict[str, Any]], budget_s: float) -> str:
    """One budget's rows: the peers and what fxtune shipped over the original, fxtune over the
    best peer (a direct interleaved comparison), what shipped, the wall time and the sites."""
    mine = [r for r in rows if r["budget_s"] == budget_s]
    peers = [*ZOO_PEERS, *(p for p in RUNTIME_PEERS if any(p in r["ratios"] for r in mine))]
    runtimes = len(peers) > len(ZOO_PEERS)  # issue 48's columns, where measured
    head = ["model", *peers, "fxtune", "fxtune / best peer", "ships", "wall s"]
    sites_head = "sites timed/reused/noise"
    head += ["build s", sites_head, "self-check"] if runtimes else [sites_head]
    body = []
    for r in mine:
        run = r["run"]
        if "error" in run:
            blank = ["-"] * (len(head) - len(peers) - 2)
            body.append([r["model"], *(_x(None) for _ in peers), "error", *blank])
            continue
        counts = run.get("site_counts") or {}
        reused = counts.get("from_cache", 0) + counts.get("identical_copies", 0)
        cells = [
            r["model"],
            *(_x((r["ratios"].get(p) or {}).get("speedup")) for p in peers),
            _x(r["ratios"]["fxtune"]["speedup"]),
            _ci(run.get("vs_best_peer")),
            run["chosen"],
            f"{run['wall_s']:.0f}",
        ]
        sites = f"{counts.get('timed', 0)}/{reused}/{counts.get('below_noise', 0)}"
        if runtimes:
            build = run.get("build_s")
            checks = r.get("self_check") or {}
            self_check = ", ".join(f"{SHORT.get(p, p)} {_ci(c)}" for p, c in checks.items())
            cells += ["-" if build is None else f"{build:.1f}", sites, self_check or "-"]
        else:
            cells.append(sites)
        body.append(cells)
    text = _table(head, body)
    vs = [r["run"]["vs_best_peer"]["speedup"] for r in mine if r["run"].get("vs_best_peer")]
    walls = [r["run"]["wall_s"] for r in mine]
    if vs:
        text += (
            f"\nfxtune / best peer at {budget_s:g} s: geomean {geomean(vs):.3f}x, "
            f"lowest {min(vs):.2f}x, at or above 0.97x on {sum(v >= 0.97 for v in vs)} of "
            f"{len(vs)}; "
        )
        within = sum(1 for w in walls if w <= budget_s + MARGIN_S)
        text += (
            f"wall time within budget + {MARGIN_S:g} s on {within} of {len(walls)} runs "
            f"({min(walls):.0f}-{max(walls):.0f} s).\n"
        )
    return text


def _zoo(name: str, budget_s: float) -> Callable[[Path], str]:
    def render(out: Path = OUT) -> str:
        doc = read(name, out)
        dates = sorted({r["recorded"]["date"] for r in doc["rows"] if r["budget_s"] == budget_s})
        commits = sorted(
            {r["recorded"]["commit"] for r in doc["rows"] if r["budget_s"] == budget_s}
        )
        m = doc["machine"]
        load = doc["rows"][0].get("load", 0) if doc["rows"] else 0
        where = (
            f"{m['cores']} CPU cores ({m['cpu']}), torch {m['torch']}, "
            f"{load or 'no'} busy processes while tuning, none while timing; "
            f"{', '.join(dates)}, commits {', '.join(commits)}"
        )
        return f"Measured on {where}.\n\n" + zoo_table(doc["rows"], budget_s)

    return render


# -------------------------------------------------------------------- training (bench.train)


def _train(name: str) -> Callable[[Path], str]:
    def render(out: Path = OUT) -> str:
        doc = read(name, out)
        names = ["compile", "winning sites", "every pass", "every pass + compile"]
        head = ["model", *(f"{n} (x eager step)" for n in names), "fxtune chose"]
        head.append("fxtune over torch.compile")
        body = []
        for r in doc["rows"]:
            by_name = {c["name"]: c for c in r["candidates"]}
            cells = [r["model"]]
            for n in names:
                match = [c for c in by_name.values() if _train_column(c["name"]) == n]
                cells.append(_ci(match[0]) if match else "-")
            cells.append(r["chosen"])
            cells.append(_ci(r.get("versus_compile")))
            body.append(cells)
        return f"Measured on {measured_on(doc)}.\n\n" + _table(head, body)

    return render


def _train_column(candidate: str) -> str:
    """The tuner's candidate names, grouped into the table's columns."""
    name = candidate.replace("eager + ", "").strip()
    return {
        "compile": "compile",
        "winning sites": "winning sites",
        "every pass": "every pass",
        "compile + every pass": "every pass + compile",
    }.get(name, name)


# ---------------------------------------------------------------------- the rest of bench/out


def gpu_check(out: Path = OUT) -> str:
    doc = read("gpu-check", out)
    text = f"**{doc['status']}**: {doc.get('gpu')}, torch {doc.get('torch')}, CUDA "
    text += f"{doc.get('cuda')}, started {doc['started']}, {doc.get('wall_s', 0):.0f} s in all.\n\n"
    text += gpu_tables.model_table(doc.get("models", []), doc.get("peers", []))
    if doc.get("checks"):
        text += "\n" + gpu_tables.check_table(doc["checks"])
    return text


def config_latency(out: Path = OUT) -> str:
    doc = read("config_latency", out)
    head = ["run", "database", "clients", "request", "p50 ms", "p99 ms", "requests/s"]
    body = [
        [
            label,
            run.get("database", "?"),
            str(case["clients"]),
            case["case"],
            f"{case['p50_ms']:.1f}",
            f"{case['p99_ms']:.1f}",
            f"{case['throughput_rps']:.0f}",
        ]
        for label, run in doc["runs"].items()
        for case in run["cases"]
    ]
    return _table(head, body)


def upload_checks(out: Path = OUT) -> str:
    doc = read("upload_checks", out)
    head = ["checker", "upload median s", "back to back median s", "service RSS MB"]
    head.append("checker RSS MB")
    body = []
    for label in ("warm", "cold"):
        run = doc[label]
        back = run.get("back_to_back_s_median")
        body.append(
            [
                label,
                f"{run['upload_s_median']:.2f}",
                "-" if back is None else f"{back:.2f}",
                f"{run.get('service_rss_mb', 0):.0f}",
                f"{run.get('warm_checker_rss_mb', 0):.0f}",
            ]
        )
    text = f"A {doc['program_mb']:.0f} MB upload.\n\n" + _table(head, body)
    hostile = doc["warm"].get("hostile") or {}
    if hostile:
        rows = [[case, str(r["status"]), f"{r['s']:.2f}"] for case, r in hostile.items()]
        text += "\nHostile uploads (warm checker):\n\n" + _table(["case", "status", "s"], rows)
    return text


def clock_noise(out: Path = OUT) -> str:
    doc = read("clock_noise", out)
    head = ["load", "wall clock: spread (log sd)", "CPU clock: spread (log sd)"]
    body = [
        [label, f"{r['wall']['log_sd']:.1%}", f"{r['cpu']['log_sd']:.1%}"]
        for label, r in doc["results"].items()
    ]
    intro = f"{doc['model']}, {doc['pairs']} paired calls, {doc['threads']} thread(s), "
    return intro + f"torch {doc['torch']}.\n\n" + _table(head, body)


def hostile_requests(out: Path = OUT) -> str:
    doc = read("hostile_requests", out)
    label = "after" if "after" in doc else next(iter(doc))
    head = ["request", "status", "s", "peak RSS growth MB"]
    body = [
        [
            r["case"],
            str(r["status"]),
            f"{r['seconds']:.3f}",
            f"{r.get('rss_peak_mb', 0) - r.get('rss_before_mb', 0):.1f}",
        ]
        for r in doc[label]["runs"]
    ]
    return f"Run `{label}`.\n\n" + _table(head, body)


# name -> (the bench/out files it reads, how it renders)
BLOCKS: dict[str, tuple[tuple[str, ...], Callable[[Path], str]]] = {
    "cpu": (("results",), results_summary),
    "results": (("results",), results_full),
    "results-dynamic": (("results",), results_dynamic),
    "results-roofline": (("results",), results_roofline),
    "zoo-60": (("zoo",), _zoo("zoo", 60.0)),
    "zoo-300": (("zoo",), _zoo("zoo", 300.0)),
    "zoo-load2-60": (("zoo-load2",), _zoo("zoo-load2", 60.0)),
    "zoo-load2-300": (("zoo-load2",), _zoo("zoo-load2", 300.0)),
    "train-sgd": (("train-sgd",), _train("train-sgd")),
    "train-adamw": (("train-adamw",), _train("train-adamw")),
    "gpu-check": (("gpu-check",), gpu_check),
    "config-latency": (("config_latency",), config_latency),
    "upload-checks": (("upload_checks",), upload_checks),
    "clock-noise": (("clock_noise",), clock_noise),
    "hostile-requests": (("hostile_requests",), hostile_requests),
}


def fill(text: str, out: Path = OUT) -> str:
    """`text` with every marked block regenerated; an unknown block name is an error."""

    def render(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise KeyError(f"no table named {name!r} (bench/tables.py BLOCKS)")
        return match.group(1) + BLOCKS[name][1](out) + match.group(4)

    return BLOCK.sub(render, text)


def plot(out: Path = OUT, path: Path = PLOT) -> Path:
    """`make bench`'s figure: each model's speed over eager per variant, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = read("results", out)
    rows = _static_rows(doc)
    cols = rows[0]["columns"]
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(cols)
    for i, col in enumerate(cols):
        xs = [j + i * width for j in range(len(rows))]
        ys = [r["ratios"][col]["speedup"] or 0.0 for r in rows]
        lo = [y - (r["ratios"][col]["ci_low"] or y) for y, r in zip(ys, rows, strict=True)]
        hi = [(r["ratios"][col]["ci_high"] or y) - y for y, r in zip(ys, rows, strict=True)]
        ax.bar(xs, ys, width, label=col, yerr=[lo, hi], capsize=2)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["model"] for r in rows])
    ax.set_ylabel("speed over eager (x)")
    m = doc["machine"]
    ax.set_title(f"fxtune on {m['cores']} CPU cores ({m['cpu']}), torch {m['torch']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)
    return path


def stale(repo: Path = REPO, out: Path = OUT) -> list[str]:
    """The target files whose blocks differ from what bench/out gives."""
    return [
        t
        for t in TARGETS
        if (repo / t).exists() and fill((repo / t).read_text(), out) != (repo / t).read_text()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tables", description=__doc__)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        behind = stale()
        for target in behind:
            print(f"{target}: its results tables differ from bench/out (run `make tables`)")
        return 1 if behind else 0
    for target in TARGETS:
        path = REPO / target
        if path.exists():
            text = path.read_text()
            new = fill(text)
            if new != text:
                path.write_text(new)
                print(f"updated {target}")
    print(f"drew {plot().relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
