"""`make bench`: overlap_comm_compute on the sharded example, 2 and 4 gloo ranks on this machine.

Spawns the ranks, tunes in lockstep (tuner.distributed.tune: interleaved barrier-synchronised
A/B, the slowest rank's time per round counts) and writes bench/out/overlap.json with figure 5
in numbers: sequential vs overlapped step time, comm alone, compute, hidden communication (µs
and share of comm alone), per rank and for the slowest rank. Honest on small machines: with
fewer cores than ranks, gloo's background thread competes with compute and little is hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from examples.sharded import ShardedConfig, build
from tuner.distributed.tune import DistributedTuneOptions, tune_distributed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--budget-s", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("bench/out/overlap.json"))
    args = parser.parse_args(argv)
    results = {"cpu_count": os.cpu_count(), "runs": []}
    for ws in (int(x) for x in args.world_sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            build(tmp, ShardedConfig(world_size=ws))
            options = DistributedTuneOptions(world_size=ws, backend="gloo", budget_s=args.budget_s)
            report = tune_distributed(Path(tmp) / "sharded_rank{rank}.pt2", options)
        site = report["sites"][0]
        run = {
            "world_size": ws,
            "verdict": site["verdict"],
            "speedup": site["comparison"]["speedup"],
            "ci": [site["comparison"]["ci_low"], site["comparison"]["ci_high"]],
            **report["overlap_profile"],
        }
        results["runs"].append(run)
        print(json.dumps({k: run[k] for k in ("world_size", "verdict", "speedup", "ci")}))
        print(json.dumps(run["slowest_rank"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
