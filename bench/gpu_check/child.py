"""A child process of the check: `python -m bench.gpu_check.child JOB.json` runs one row.

The job file names the row's kind ("model" with the import path of its `ModelSpec`, "peer"
(one peer of a model timed against what shipped), or "service") and where to write the row;
`bench.gpu_check.isolate` starts it and reads the row.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.gpu_check.isolate import Row


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text())
    row = Row(Path(job["row"]), {"name": job["name"], "kind": job["kind"]})
    row.stage("starting")
    if job["kind"] == "model":
        from bench.gpu_check.model_check import check_model
        from bench.gpu_check.models import resolve

        check_model(job, resolve(job["spec"]), row)
    elif job["kind"] == "peer":
        from bench.gpu_check.model_check import time_peer
        from bench.gpu_check.models import resolve

        time_peer(job, resolve(job["spec"]), row)
    elif job["kind"] == "service":
        from bench.gpu_check.service_check import check_service

        check_service(job, row)
    else:
        raise ValueError(f"unknown job kind {job['kind']!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
