"""Which measurements transfer: decisions only hold between identical hardware keys.

Torch-free, so the service can key the reports it stores without importing torch."""

from __future__ import annotations

from typing import Any

from tuner.contract.device import Device


def hardware_key(hw: dict[str, Any]) -> str:
    """The kind, not the index: decisions measured on one GPU hold on an identical one."""
    kind = Device.parse(hw["device"]).kind
    return f"{kind}|{hw['name']}|torch{hw['torch']}|t{hw['threads']}"
