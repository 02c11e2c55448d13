"""Describe this machine's device in a child process, so the worker itself never imports torch.

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
from tuner.contract.exit_codes import ExitCode, exit_code_for

log = logging.getLogger("fxtune.worker")

# The child's exit status names the error it stopped with; its last line of stderr says why.
_ERRORS: dict[int, type[FxtuneError]] = {
    ExitCode.INTERNAL: UncheckedTorchError,
    ExitCode.DEVICE: DeviceUnavailableError,
}


def detect(device: Device, timeout_s: float = 120) -> dict[str, Any]:
    """The device's description; UncheckedTorchError or DeviceUnavailableError with the
    child's reason."""
    proc = subprocess.run(
        [sys.executable, "-m", "worker.hardware", str(device)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if proc.returncode != 0:
        lines = proc.stderr.strip().splitlines() or [f"status {proc.returncode}"]
        raise _ERRORS.get(proc.returncode, DeviceUnavailableError)(lines[-1])
    for line in proc.stderr.strip().splitlines():  # the override's warning, torch's own
        log.warning("device probe: %s", line)
    return json.loads(proc.stdout)


def _main(text: str) -> None:
    from tuner.host.hardware import describe, hardware_key
    from tuner.host.torch_compat import check_torch

    try:
        check_torch()
        device = Device.parse(text).require_available()
    except (UncheckedTorchError, DeviceUnavailableError) as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        sys.exit(exit_code_for(exc))
    except FxtuneError as exc:
        print(" ".join(str(exc).split()), file=sys.stderr)
        sys.exit(ExitCode.DEVICE)
    info = describe(device)
    info["key"] = hardware_key(info)
    print(json.dumps(info))


if __name__ == "__main__":
    _main(sys.argv[1])
