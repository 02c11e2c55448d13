"""Describe this machine's device in a child process, so the worker itself never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tuner.contract.device import Device
from tuner.contract.errors import DeviceUnavailableError


def detect(device: Device, timeout_s: float = 120) -> dict[str, Any]:
    """The device's description, or DeviceUnavailableError with the child's reason."""
    proc = subprocess.run(
        [sys.executable, "-m", "worker.hardware", str(device)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"status {proc.returncode}"]
        raise DeviceUnavailableError(lines[-1])
    return json.loads(proc.stdout)


def _main(text: str) -> None:
    from tuner.contract.errors import FxtuneError
    from tuner.host.hardware import describe, hardware_key

    try:
        device = Device.parse(text).require_available()
    except FxtuneError as exc:
        sys.exit(str(exc))
    info = describe(device)
    info["key"] = hardware_key(info)
    print(json.dumps(info))


if __name__ == "__main__":
    _main(sys.argv[1])
