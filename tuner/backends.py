"""Backends a tuned module can run under, by name: eager FX, inductor, XLA where installed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.device import Device

Runner = Callable[..., Any]


@dataclass
class Built:
    """A runnable form of a module; `package` is the AOTInductor file when one was made."""

    runner: Runner
    package: Path | None = None


def _eager(gm: fx.GraphModule, inputs: tuple, workdir: Path) -> Built:
    return Built(gm)


def _inductor(gm: fx.GraphModule, inputs: tuple, workdir: Path) -> Built:
    """Inductor ahead of time: what is measured is the very package a deployment loads.

    (torch.compile would add guard checks per call, which on a model with dozens of inputs
    cost more than the kernels save, and would undervalue what the package delivers.)
    """
    from tuner.capture import to_program

    program = to_program(gm, tuple(inputs))  # with the original's dynamic dims, if any
    path = package_aoti(program, workdir / f"{uuid.uuid4().hex}.aoti.pt2")
    return Built(load_aoti(path), path)


def _xla(gm: fx.GraphModule, inputs: tuple, workdir: Path) -> Built:
    return Built(torch.compile(gm, backend="openxla"))


def xla_available() -> bool:
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS: dict[str, Callable[[fx.GraphModule, tuple, Path], Built]] = {
    "eager": _eager,
    "inductor": _inductor,
    "xla": _xla,
}


def available_backends(device: Device) -> list[str]:
    if device.kind == "xla":
        return ["xla"] if xla_available() else []
    return ["eager", "inductor"]


def build(backend: str, gm: fx.GraphModule, inputs: tuple, workdir: Path) -> Built:
    try:
        make = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}") from None
    workdir.mkdir(parents=True, exist_ok=True)
    return make(gm, inputs, workdir)


def package_aoti(program: ExportedProgram, path: Path) -> Path:
    """Compile ahead of time so a deployment gets inductor's speed without compiling.

    Kernels carry profiler ranges (a flag check when no profiler runs), so profiles of the
    package show its kernels instead of one opaque call.
    """
    from torch._inductor import aoti_compile_and_package

    from tuner.profiling.counting import inductor_kernel_ranges

    path.parent.mkdir(parents=True, exist_ok=True)
    with inductor_kernel_ranges():
        return Path(aoti_compile_and_package(program, package_path=str(path)))


# AOTInductor packages check their inputs (sizes against the static sizes and dynamic ranges
# they were compiled for, strides, device) only when this is set before their first call; without
# it, an input of another size is read as if it had the compiled size: a wrong answer, no error.
CHECK_INPUTS_ENV = "AOTI_RUNTIME_CHECK_INPUTS"


def load_aoti(path: Path) -> Runner:
    """Load a package with its input checks on (see CHECK_INPUTS_ENV): never a wrong answer.

    The flag is process-wide and read once per loaded model, so it is set before loading.
    """
    import os

    from torch._inductor import aoti_load_package

    os.environ[CHECK_INPUTS_ENV] = "1"
    return aoti_load_package(str(path))
