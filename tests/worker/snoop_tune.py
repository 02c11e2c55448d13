"""Stands in for `fxtune tune` as an uploaded program could behave once running: it tries to
read the service's files and another job's folder, to replace the worker's shared caches, to
fill the memory-backed folders, to read other processes' environments, looks for the worker's
token, and prints what it found (and a token it may have learned, LEAK_VALUE) in its progress
and in its error."""

from __future__ import annotations

import contextlib
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


def poke(path: str) -> str:
    try:
        with open(path, "w") as f:
            f.write('{"planted": true}')
        return "wrote"
    except OSError as exc:
        return type(exc).__name__


def fill(folder: str, limit: int = 1024**3) -> int:
    """Bytes written into `folder` before it refused more (at most `limit`)."""
    written, chunk = 0, b"\0" * (8 * 1024**2)
    try:
        with open(os.path.join(folder, "fill"), "wb") as f:
            while written < limit:
                f.write(chunk)
                f.flush()
                written += len(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(folder, "fill"))
    return written


def environments() -> dict[str, int]:
    """Other processes whose environment this one can read, and those holding a token."""
    readable = tokens = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        readable += 1
        tokens += b"TOKEN=" in env
    return {"readable": readable, "with_token": tokens}


def main() -> None:
    targets = json.loads(os.environ.get("SNOOP_TARGETS", "{}"))
    seen: dict[str, object] = {name: peek(path) for name, path in targets.items()}
    writes = json.loads(os.environ.get("SNOOP_WRITES", "{}"))
    seen.update({f"write_{name}": poke(path) for name, path in writes.items()})
    if os.environ.get("SNOOP_FILL"):
        seen["fill_tmp"] = fill("/tmp")
        seen["fill_shm"] = fill("/dev/shm")
        seen["environ"] = environments()
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
