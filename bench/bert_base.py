"""Tuning time for a BERT-base-sized program on this machine: `python -m bench.bert_base`.

BERT-base shape (12 layers, hidden 768, 12 heads) from a transformers config with random weights
(nothing is downloaded); batch 1, sequence 128. Prints the tuning time and what was decided.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
import transformers
from rich.console import Console
from torch import nn

from tuner.graph.capture import export_module
from tuner.tuning.tuner import TuneOptions, tune_program


class LastHidden(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, attention_mask=mask, return_dict=True).last_hidden_state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--backend", action="append", default=None)
    args = parser.parse_args()
    console = Console()
    config = transformers.BertConfig(attn_implementation="sdpa")
    model = LastHidden(transformers.BertModel(config)).eval()
    ids = torch.randint(0, config.vocab_size, (1, 128))
    mask = torch.ones(1, 128, dtype=torch.long)
    started = time.monotonic()
    program = export_module(model, (ids, mask))
    export_s = time.monotonic() - started
    with tempfile.TemporaryDirectory() as tmp:
        options = TuneOptions(
            budget_s=args.budget_s, backends=args.backend, cache_path=Path(tmp) / "cache.json"
        )
        started = time.monotonic()
        outcome = tune_program(program, options)
        tune_s = time.monotonic() - started
    cfg = outcome.config
    console.print(
        f"BERT-base: export {export_s:.1f} s, tuning {tune_s:.1f} s "
        f"(budget {args.budget_s:.0f} s, {torch.get_num_threads()} threads)"
    )
    for s in cfg.sites:
        console.print(
            f"  site {s.pass_name} x{s.count}: {s.verdict} "
            f"{'' if s.speedup is None else f'{s.speedup:.2f}x'}"
        )
    for f in cfg.candidates:
        sp = "-" if f.speedup is None else f"{f.speedup:.2f}x"
        console.print(f"  whole model {f.name}: {sp} {f.verdict} {f.reason or ''}")
    console.print(
        f"chosen: {cfg.whole_model.name}; timed candidates {cfg.tuning['timed_candidates']}"
    )


if __name__ == "__main__":
    main()
