"""Describe this machine's device in a child process, so the worker itself never imports torch.

On a CPU the description names the inference runtimes installed here and their versions
(`tuner.backends.runtimes`): the worker declares them at every claim, and its jobs are tuned
with what it has.

The child also checks that torch is one fxtune was checked on (`check_torch`): it imports
torch anyway, and every job would fail on an unchecked one.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

from tuner.contract.device import Device
from tuner.contract.errors import DeviceUnavailableError, FxtuneError, UncheckedTorchError
from tuner.contract.exit_codes import exit_code_for

log = logging.getLogger("fxtune.worker")

# What the child stopped with on purpose, named on its stdout: {"error": NAME, "message": ...}.
_ERRORS: dict[str, type[FxtuneError]] = {
    "unchecked_torch": UncheckedTorchError,
    "device_unavailable": DeviceUnavailableError,
}


def detect(device: Device, timeout_s: float = 120) -> dict[str, Any]:
    """The device's description; UncheckedTorchError or DeviceUnavailableError with the
    child's reason (a child that died otherwise: DeviceUnavailableError with its last line)."""
    proc = subprocess.run(
        [sys.executable, "-m", "worker.hardware", str(device)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        stopped = _stopped_with(proc.stdout)
        if stopped is not None:
            raise stopped
        lines = proc.stderr.strip().splitlines() or [f"status {proc.returncode}"]
        raise DeviceUnavailableError(lines[-1])
    for line in proc.stderr.strip().splitlines():  # the override's warning, torch's own
        log.warning("device probe: %s", line)
    return json.loads(proc.stdout)


def _stopped_with(stdout: str) -> FxtuneError | None:
    try:
        said = json.loads(stdout.strip().splitlines()[-1])
        return _ERRORS[said["error"]](str(said["message"]))
    except (IndexError, ValueError, TypeError, KeyError):
        return None


def _main(text: str) -> None:
    from tuner.backends.runtimes import installed_runtimes
    from tuner.host.hardware import describe, hardware_key
    from tuner.host.torch_compat import check_torch

    try:
        check_torch()
        device = Device.parse(text).require_available()
    except (UncheckedTorchError, DeviceUnavailableError) as exc:
        name = next(n for n, cls in _ERRORS.items() if isinstance(exc, cls))
        print(json.dumps({"error": name, "message": " ".join(str(exc).split())}))
        sys.exit(exit_code_for(exc))
    info = describe(device)
    info["key"] = hardware_key(info)
    if device.kind == "cpu":  # the runtimes its jobs may be tuned under, with their versions
        info["runtimes"] = installed_runtimes()
    print(json.dumps(info))


if __name__ == "__main__":
    _main(sys.argv[1])
