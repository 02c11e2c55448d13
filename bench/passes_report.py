"""Every pass applied blindly to each example: op counts before/after and the CPU speed ratio.

`python -m bench.passes_report [--budget-s N]`. The ratio is original / rewritten time per call,
measured interleaved in one run (tuner.measure.timing.compare), with its 95% interval.
"""

from __future__ import annotations

import argparse
import copy

import torch
from rich.console import Console
from rich.table import Table

from examples.models import EXAMPLES
from tuner.graph.capture import export_module, to_graph_module
from tuner.measure.timing import compare
from tuner.passes import pass_names
from tuner.passes.apply import apply_steps, count_ops


def report_row(name: str, budget_s: float) -> list[str]:
    example = EXAMPLES[name]()
    inputs = example.example_inputs
    gm0 = to_graph_module(export_module(example.module, inputs))
    result = apply_steps(copy.deepcopy(gm0), inputs, [(p, None) for p in pass_names()])
    packed = result.pack(inputs)
    with torch.inference_mode():
        c = compare(lambda: gm0(*inputs), lambda: result.gm(*packed), budget_s=budget_s)
    return [
        name,
        str(count_ops(gm0)),
        str(count_ops(result.gm)),
        str(len(result.applied)),
        f"{c.speedup:.2f}x",
        f"{c.ci_low:.2f}-{c.ci_high:.2f} ({c.rounds} rounds)",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--budget-s", type=float, default=10.0)
    parser.add_argument("--models", nargs="*", default=list(EXAMPLES))
    args = parser.parse_args()
    table = Table("model", "ops before", "ops after", "sites", "speed ratio", "95% interval")
    for name in args.models:
        table.add_row(*report_row(name, args.budget_s))
    Console().print(table)
    Console().print(f"threads: {torch.get_num_threads()}; passes: {', '.join(pass_names())}")


if __name__ == "__main__":
    main()
