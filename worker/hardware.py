"""Describe this machine's device in a child process, so the worker itself never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any


class DeviceUnavailable(RuntimeError):
    """The worker was asked to serve a device this machine does not have."""


def detect(device: str, timeout_s: float = 120) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "worker.hardware", device],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"status {proc.returncode}"]
        raise DeviceUnavailable(lines[-1])
    return json.loads(proc.stdout)


def _main(device: str) -> None:
    from tuner.hardware import check_device, describe, hardware_key

    try:
        check_device(device)
    except ValueError as exc:
        sys.exit(str(exc))
    info = describe(device)
    info["key"] = hardware_key(info)
    print(json.dumps(info))


if __name__ == "__main__":
    _main(sys.argv[1])
