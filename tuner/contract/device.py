"""The one device value: parsed once at the edges (CLI, options, worker, API), then passed down.

Before this, six modules parsed device strings, each with its own accepted set and error type,
and the index was dropped on the way (a `cuda:1` run profiled its baseline on cuda:0). Here the
kinds fxtune supports live in one registry, `str(Device)` round-trips ("cuda:1"), and a device
that is supported but absent raises one error type.

torch is imported lazily: the worker and the service parse devices without importing torch.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tuner.contract.errors import DeviceUnavailableError, UnsupportedDeviceError

if TYPE_CHECKING:
    import torch


def _cpu_missing(device: Device) -> str | None:
    return None


def _cuda_missing(device: Device) -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "torch.cuda.is_available() is False (no CUDA GPU or a CPU-only torch build)"
    count = torch.cuda.device_count()
    if device.index is not None and device.index >= count:
        return f"this machine has {count} CUDA device(s) (cuda:0 to cuda:{count - 1})"
    return None


def _xla_missing(device: Device) -> str | None:
    if importlib.util.find_spec("torch_xla") is None:
        return "torch_xla is not installed"
    return None


@dataclass(frozen=True)
class DeviceKind:
    """A kind fxtune can tune on: whether it takes an index, and why it may be missing here."""

    name: str
    indexed: bool
    missing: Callable[[Device], str | None]  # None when present, else why not


KINDS: dict[str, DeviceKind] = {
    k.name: k
    for k in (
        DeviceKind("cpu", indexed=False, missing=_cpu_missing),
        DeviceKind("cuda", indexed=True, missing=_cuda_missing),
        DeviceKind("xla", indexed=True, missing=_xla_missing),
    )
}

_FORM = re.compile(r"(?P<kind>[a-z]+)(?::(?P<index>[0-9]{1,4}))?")


@dataclass(frozen=True)
class Device:
    kind: str
    index: int | None = None

    def __post_init__(self) -> None:
        spec = KINDS.get(self.kind)
        if spec is None:
            raise UnsupportedDeviceError(
                f"unknown device {self.kind!r}; use one of {', '.join(KINDS)}"
            )
        if self.index is not None and (not spec.indexed or self.index < 0):
            raise UnsupportedDeviceError(f"device {self.kind!r} takes no index {self.index}")

    @classmethod
    def parse(cls, text: str | Device) -> Device:
        """'cpu', 'cuda', 'cuda:1', 'xla:0' (a Device is returned as it is)."""
        if isinstance(text, Device):
            return text
        match = _FORM.fullmatch(str(text).strip().lower())
        if match is None:
            raise UnsupportedDeviceError(
                f"cannot read {text!r} as a device; use one of {', '.join(KINDS)}, "
                "optionally with an index (cuda:1)"
            )
        index = match["index"]
        return cls(match["kind"], int(index) if index is not None else None)

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device(str(self))

    def missing(self) -> str | None:
        """Why this machine cannot run on the device, or None when it can."""
        return KINDS[self.kind].missing(self)

    def require_available(self) -> Device:
        """This device, or DeviceUnavailableError saying what is missing (before any work)."""
        reason = self.missing()
        if reason is not None:
            raise DeviceUnavailableError(f"device {str(self)!r} is not available here: {reason}")
        return self


CPU = Device("cpu")


def parse_kind(text: Any) -> str:
    """A bare kind ('cuda'), for the service, whose jobs target a kind and not one GPU."""
    device = Device.parse(text)
    if device.index is not None:
        raise UnsupportedDeviceError(
            f"{text!r}: jobs and configs are per device kind ({device.kind!r}); "
            "the GPU index is the worker's choice"
        )
    return device.kind
