"""What a measurement was taken on: decisions only transfer between identical hardware keys."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import torch


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def describe(device: str) -> dict[str, Any]:
    kind = torch.device(device).type
    if kind == "cuda":
        name = torch.cuda.get_device_name(torch.device(device))
    elif kind == "xla":
        name = "xla"
    else:
        name = _cpu_name()
    return {
        "device": kind,
        "name": name,
        "torch": torch.__version__.split("+")[0],
        "threads": torch.get_num_threads(),
    }


def hardware_key(hw: dict[str, Any]) -> str:
    return f"{hw['device']}|{hw['name']}|torch{hw['torch']}|t{hw['threads']}"


def check_device(device: str) -> str:
    """Validate a device name early, with a message that says what is available."""
    kind = device.split(":")[0]
    if kind == "cpu":
        return device
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' requested but no CUDA GPU is available here")
        return device
    if kind == "xla":
        try:
            import torch_xla  # noqa: F401
        except ImportError:
            raise ValueError("device 'xla' requested but torch_xla is not installed") from None
        return device
    raise ValueError(f"unknown device {device!r}; use cpu, cuda or xla")
