"""The README's and the docs' results tables are what bench/out's files give (`make tables`)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench import tables

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_tables_match_bench_out() -> None:
    assert tables.stale() == [], "run `make tables` (python -m bench.tables)"


def test_the_readme_table_names_the_machine_and_torch() -> None:
    block = tables.BLOCK.search((REPO / "README.md").read_text())
    assert block is not None and block["name"] == "cpu"
    machine = tables.read("results")["machine"]
    assert f"torch {machine['torch']}" in block["body"] and machine["cpu"] in block["body"]
    assert block["body"].count("\n| ") >= 5  # a row per model


def test_bench_out_holds_one_current_file_per_benchmark_and_each_is_shown() -> None:
    shown = {name for sources, _ in tables.BLOCKS.values() for name in sources}
    assert {p.stem for p in tables.OUT.glob("*.json")} == shown
    assert [p for p in tables.OUT.iterdir() if p.is_dir()] == []


def test_a_changed_figure_changes_the_readme(tmp_path: Path) -> None:
    """The control: the check would catch prose that disagrees with its run."""
    out = tmp_path / "out"
    shutil.copytree(tables.OUT, out)
    doc = json.loads((out / "results.json").read_text())
    doc["rows"][0]["ratios"]["fxtune"]["speedup"] = 9.99
    (out / "results.json").write_text(json.dumps(doc))
    readme = (REPO / "README.md").read_text()
    assert "| 9.99x |" in tables.fill(readme, out)
    assert tables.stale(REPO, out) != []


def test_the_roofline_table_divides_the_floor_into_the_runs_times(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(tables.OUT, out)
    doc = json.loads((out / "results.json").read_text())
    rows = [r for r in doc["rows"] if "columns" in r][:2]
    for row, (fx_ms, aoti_ms) in zip(rows, ((2.0, 4.0), (1.0, 9.0)), strict=True):
        row["ratios"]["fxtune"].update(ms=fx_ms)
        row["ratios"]["AOTInductor"].update(ms=aoti_ms)
        row["roofline"] = {"gflop": 0.2, "peak_gflops": 200.0, "floor_ms": 1.0}
    doc["rows"] = rows
    (out / "results.json").write_text(json.dumps(doc))
    text = tables.results_roofline(out)
    assert "the floor at 200 GFLOP/s" in text
    first, second, mean, _, goal = text.splitlines()[-5:]
    assert first.endswith("| 0.200 | 1.00 | 4.00 | 2.00 | 50% | 4.00x |")
    assert second.endswith("| 9.00 | 1.00 | 100% | 9.00x |")
    assert mean == "| geomean |  |  |  |  | 71% | 6.00x |"
    assert goal == "1.8x over AOTInductor (geomean) would take 30% of the floor on average; " + (
        "what fxtune ships runs at 71%."
    )


def test_a_run_without_floors_says_so(tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(tables.OUT, out)
    doc = json.loads((out / "results.json").read_text())
    for row in doc["rows"]:
        row.pop("roofline", None)
    (out / "results.json").write_text(json.dumps(doc))
    assert "No row of this run measured the floor" in tables.results_roofline(out)
