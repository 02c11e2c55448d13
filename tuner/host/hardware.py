"""What a measurement was taken on (its key, `hardware_key`, lives in the torch-free contract)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch

from tuner.contract.device import Device
from tuner.contract.hardware import hardware_key

__all__ = ["describe", "hardware_key"]


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe(device: Device) -> dict[str, Any]:
    """What `device` is; "device" keeps the index ("cuda:1") so later steps use the same one."""
    if device.kind == "cuda":
        name = torch.cuda.get_device_name(device.torch_device)
    elif device.kind == "xla":
        name = "xla"
    else:
        name = _cpu_name()
    return {
        "device": str(device),
        "name": name,
        "torch": torch.__version__.split("+")[0],
        "threads": torch.get_num_threads(),
    }
