"""The zoo's models export as users export them, and its table says what was measured."""

from __future__ import annotations

from pathlib import Path

import torch

from bench.tables import zoo_table
from bench.zoo import budget_rows
from bench.zoo_models import ZOO, exported
from tuner.graph.capture import example_inputs
from tuner.loading.load import load_program


def test_the_zoo_spans_the_architectures_the_issue_names() -> None:
    assert len(ZOO) >= 12
    assert {"efficientnet_b0", "bert_mini", "dlrm_26tables", "distilbert_dyn"} <= set(ZOO)


def test_a_zoo_program_loads_through_fxtune_and_answers_as_eager(tmp_path: Path) -> None:
    program = exported("dlrm_26tables")
    torch.export.save(program, tmp_path / "dlrm.pt2")
    loaded = load_program(tmp_path / "dlrm.pt2")
    inputs = example_inputs(loaded)
    torch.testing.assert_close(loaded.module()(*inputs), program.module()(*inputs))
    tables = [n for n in loaded.graph.nodes if "embedding_bag" in str(n.target)]
    assert len(tables) == 26


def test_the_table_reports_each_budget_against_the_best_peer() -> None:
    ratio = {"speedup": 1.5, "ci_low": 1.4, "ci_high": 1.6, "rounds": 9}
    run = {
        "budget_s": 60.0,
        "wall_s": 61.0,
        "chosen": "inductor",
        "site_counts": {"timed": 3, "from_cache": 1, "identical_copies": 4, "below_noise": 2},
        "vs_best_peer": {"speedup": 0.98, "ci_low": 0.97, "ci_high": 0.99, "rounds": 9},
    }
    row = {
        "model": "m",
        "ratios": {"torch.compile": ratio, "AOTInductor": ratio, "fxtune 60s": ratio},
        "best_peer": "AOTInductor",
        "runs": [run],
    }
    (kept,) = budget_rows(row, load=0)
    assert kept["ratios"]["fxtune"] == ratio and kept["budget_s"] == 60.0
    table = zoo_table([kept], 60.0)
    assert "| m | 1.50x | 1.50x | 1.50x | 0.98x [0.97, 0.99] | inductor | 61 | 3/5/2 |" in table
    assert "geomean 0.980x, lowest 0.98x" in table
    assert "within budget + 15 s on 1 of 1 runs" in table


def test_the_table_has_the_runtimes_build_time_and_self_check_where_measured() -> None:
    """Issue 48: OpenVINO and ONNX Runtime are peers (and count for the best peer), the chosen
    candidate's build time and each runtime's timing against itself are shown."""
    fig = {"speedup": 2.0, "ci_low": 1.9, "ci_high": 2.1, "rounds": 9}
    same = {"speedup": 1.0, "ci_low": 0.99, "ci_high": 1.01, "rounds": 9}
    run = {
        "budget_s": 60.0,
        "wall_s": 70.0,
        "chosen": "openvino",
        "build_s": 2.5,
        "site_counts": {"timed": 1},
        "vs_best_peer": same,
    }
    ratios = {"torch.compile": fig, "AOTInductor": fig, "OpenVINO": fig, "ONNX Runtime": fig}
    row = {
        "model": "m",
        "ratios": {**ratios, "fxtune 60s": fig},
        "best_peer": "OpenVINO",
        "runs": [run],
        "self_check": {"OpenVINO": same, "ONNX Runtime": same},
    }
    (kept,) = budget_rows(row, load=0)
    table = zoo_table([kept], 60.0)
    assert "| OpenVINO | ONNX Runtime | fxtune | fxtune / best peer |" in table
    checks = "OV 1.00x [0.99, 1.01], ORT 1.00x [0.99, 1.01]"
    assert f"| openvino | 70 | 2.5 | 1/0/0 | {checks} |" in table
