"""Stands in for `fxtune tune` as an uploaded program could behave once running: it tries to
read the service's files and another job's folder, looks for the worker's token, and prints
what it found (and a token it may have learned, LEAK_VALUE) in its progress and in its error."""

from __future__ import annotations

import json
import os
import sys
import time


def peek(path: str) -> str:
    try:
        if os.path.isdir(path):
            return "listed " + ",".join(sorted(os.listdir(path)))
        with open(path, "rb") as f:
            return f"read {len(f.read())} bytes"
    except OSError as exc:
        return type(exc).__name__


def main() -> None:
    targets = json.loads(os.environ.get("SNOOP_TARGETS", "{}"))
    seen = {name: peek(path) for name, path in targets.items()}
    token = os.environ.get("FXTUNE_WORKER_TOKEN") or os.environ.get("LEAK_VALUE", "")
    seen["env_token"] = "FXTUNE_WORKER_TOKEN" in os.environ
    message = json.dumps({"seen": seen, "leak": token})
    # The worker relays progress on its heartbeat, and at once only where the last heartbeat is
    # more than a second old: said again a second later, the message goes out then.
    for _ in range(2):
        print(json.dumps({"progress": 0.5, "message": message}), flush=True)
        time.sleep(1.2)
    sys.stderr.write(f"Traceback ...\nerror: leaking {token} from http://w:{token}@h/\n")
    sys.exit(2)


if __name__ == "__main__":
    main()
