"""What other work on the cores does to a CPU timing, by the wall clock and by CPU time.

The figure behind `tuner.measure.timing.Clock`: a zoo model (ResNet-18 by default) on one
thread, called back to back in pairs, first on a quiet machine, then beside `--load` busy
single-threaded processes (`bench.zoo.background_load`). Per clock it reports the median
seconds per call and the spread of the paired log ratios (what a comparison's interval is made
of; two calls of the same model, so the true ratio is 1). Writes bench/out/clock_noise.json.

    python -m bench.clock_noise [--model resnet18] [--pairs 20] [--load 2]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from bench.zoo import OUT, background_load
from bench.zoo_models import exported
from tuner.graph.capture import example_inputs

CLOCKS: dict[str, Callable[[], int]] = {
    "wall": time.perf_counter_ns,
    "cpu": time.process_time_ns,
}


def spread(call: Callable[[], Any], clock: Callable[[], int], pairs: int) -> dict[str, float]:
    """Median ms per call and the standard deviation of log(first / second) over `pairs`."""
    firsts, seconds = [], []
    for _ in range(pairs):
        t0 = clock()
        call()
        t1 = clock()
        call()
        t2 = clock()
        firsts.append(t1 - t0)
        seconds.append(t2 - t1)
    logs = [math.log(a / b) for a, b in zip(firsts, seconds, strict=True)]
    return {
        "median_ms": round(statistics.median(firsts + seconds) / 1e6, 2),
        "log_sd": round(statistics.pstdev(logs), 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--load", type=int, default=2, help="busy processes in the loaded part")
    args = parser.parse_args()
    torch.set_num_threads(1)
    program = exported(args.model)
    module, inputs = program.module(), example_inputs(program)

    def call() -> Any:
        return module(*inputs)

    rows: dict[str, Any] = {}
    with torch.inference_mode():
        for _ in range(3):
            call()
        for busy in (0, args.load):
            with background_load(busy):
                if busy:
                    time.sleep(1.0)  # the busy processes started
                rows[f"busy={busy}"] = {
                    name: spread(call, clock, args.pairs) for name, clock in CLOCKS.items()
                }
    doc = {"model": args.model, "threads": 1, "pairs": args.pairs, "torch": torch.__version__}
    doc["results"] = rows
    OUT.mkdir(exist_ok=True)
    (OUT / "clock_noise.json").write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
