"""The zoo's models export as users export them, and its table says what was measured."""

from __future__ import annotations

from pathlib import Path

import torch

from bench.zoo import markdown
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
        "runs": [run],
    }
    table = markdown([row], [60.0], load=0)
    assert "| m | 1.50x | 1.50x | 1.50x | 0.98x [0.97, 0.99] | inductor | 61 | 3/5/2 |" in table
    assert "geomean 0.980x, min 0.98x" in table
