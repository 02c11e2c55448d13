"""The check's two outputs: `gpu-check.json` (every figure) and `gpu-check.md` (the tables)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

JSON_NAME, MARKDOWN_NAME = "gpu-check.json", "gpu-check.md"


def _num(x: Any, fmt: str = "{:.3g}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _before_after(counts: dict[str, Any] | None) -> str:
    if not counts:
        return "-"
    return f"{_num(counts.get('baseline'), '{:.0f}')} → {_num(counts.get('tuned'), '{:.0f}')}"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def model_table(rows: list[dict[str, Any]], peers: list[str]) -> str:
    """One line per model; "x P" is what fxtune ships over P (P's time / fxtune's), with its
    95% interval, from one interleaved comparison each."""
    head = ["model", "status", "tune exit", "tune s", "backend (chosen)", "outputs",
            "max abs err", *[f"x {p}" for p in ["eager", *peers]],
            "kernels/iter before → after", "ops/iter before → after"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        tune = r.get("tune") or {}
        speedups = r.get("speedups") or {}
        chosen = f"{r['backend']} ({r.get('chosen')})" if r.get("backend") else "-"
        cells = [
            r["name"],
            r.get("status", "?"),
            _num(tune.get("rc"), "{}"),
            _num(tune.get("wall_s"), "{:.0f}"),
            chosen,
            r.get("outputs", "-"),
            _num(r.get("max_abs_error"), "{:.2e}"),
            *[(speedups.get(p) or {}).get("text", "-") for p in ["eager", *peers]],
            _before_after(r.get("kernels_per_iter")),
            _before_after(r.get("ops_per_iter")),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _details(r: dict[str, Any]) -> str:
    if r["name"] == "pytest -m cuda":
        counts = ("tests", "passed", "skipped", "failures", "errors")
        return ", ".join(f"{k} {r[k]}" for k in counts if k in r) + f" ({r.get('files')} files)"
    parts = [f"model {r['model']}"] if r.get("model") else []
    if r.get("submit"):
        rc = r["submit"]["rc"]
        parts.append(f"submit --wait exit {_num(rc, '{}')} in {r['submit']['wall_s']:.0f} s")
    if r.get("load_tuned"):
        lt = r["load_tuned"]
        parts.append(
            f"load_tuned -> {lt['module']}, max abs err {_num(lt['max_abs_error'], '{:.2e}')}"
        )
    return "; ".join(parts) or "-"


def check_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| check | status | s | details |", "|---|---|---|---|"]
    for r in rows:
        cells = [r["name"], r.get("status", "?"), _num(r.get("wall_s"), "{:.0f}"), _details(r)]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(doc: dict[str, Any]) -> str:
    where = ", ".join(
        f"{k} {doc[k]}" for k in ("device", "gpu", "torch", "cuda") if doc.get(k) is not None
    )
    text = f"# make gpu-check\n\n**{doc['status']}**\n\n" + (f"{where}; " if where else "")
    text += f"started {doc['started']}"
    if doc.get("wall_s") is not None:
        text += f", {doc['wall_s']:.0f} s in all"
    text += "\n"
    if doc.get("unchecked_torch"):
        text += f"\n{doc['unchecked_torch']}\n"
    if doc.get("models"):
        text += "\n## Models\n\n" + model_table(doc["models"], doc.get("peers", []))
    if doc.get("checks"):
        text += "\n## Checks\n\n" + check_table(doc["checks"])
    return text


def write(out: Path, doc: dict[str, Any]) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / JSON_NAME, out / MARKDOWN_NAME
    json_path.write_text(json.dumps(doc, indent=2, default=str))
    md_path.write_text(markdown(doc))
    return json_path, md_path
