"""Backends a tuned module can run under, by name: eager FX, inductor, XLA where installed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram

Runner = Callable[..., Any]


def _eager(gm: fx.GraphModule) -> Runner:
    return gm


def _inductor(gm: fx.GraphModule) -> Runner:
    return torch.compile(gm, backend="inductor")


def _xla(gm: fx.GraphModule) -> Runner:
    return torch.compile(gm, backend="openxla")


def xla_available() -> bool:
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS: dict[str, Callable[[fx.GraphModule], Runner]] = {
    "eager": _eager,
    "inductor": _inductor,
    "xla": _xla,
}


def available_backends(device: str) -> list[str]:
    kind = device.split(":")[0]
    if kind == "xla":
        return ["xla"] if xla_available() else []
    return ["eager", "inductor"]


def build(backend: str, gm: fx.GraphModule) -> Runner:
    try:
        return BACKENDS[backend](gm)
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}") from None


def package_aoti(program: ExportedProgram, path: Path) -> Path:
    """Compile ahead of time so a deployment gets inductor's speed without compiling."""
    from torch._inductor import aoti_compile_and_package

    path.parent.mkdir(parents=True, exist_ok=True)
    return Path(aoti_compile_and_package(program, package_path=str(path)))


def load_aoti(path: Path) -> Runner:
    from torch._inductor import aoti_load_package

    return aoti_load_package(str(path))
