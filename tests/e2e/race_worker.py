"""One of the racing workers: claim and complete with a trivial result until the queue is empty.

Prints the ids of the jobs it completed as a JSON list.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.service.fakes import HARDWARE, write_result
from worker.client import ServiceClient


def main(url: str, worker_id: str, program: Path, scratch: Path) -> None:
    client = ServiceClient(url, None)
    files = write_result(scratch, program)
    done: list[int] = []
    while (job := client.claim(worker_id, "cpu", HARDWARE)) is not None:
        client.complete(job, files)
        done.append(job.job_id)
    print(json.dumps(done))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
