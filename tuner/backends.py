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
    cost more than the kernels save; that is the separate "compile" backend, timed as such.)
    """
    from tuner.capture import to_program

    program = to_program(gm, tuple(inputs))  # with the original's dynamic dims, if any
    path = package_aoti(program, workdir / f"{uuid.uuid4().hex}.aoti.pt2")
    return Built(load_aoti(path), path)


def _compile(gm: fx.GraphModule, inputs: tuple, workdir: Path) -> Built:
    """torch.compile with its defaults, as a user would run it (guards and all).

    It compiles on its first call, which the caller's output check makes before any timing.
    """
    return Built(torch.compile(gm))


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
    "compile": _compile,
    "xla": _xla,
}

# What a user would pick instead of fxtune: the original under each of these, timed as shipped.
# They are always whole-model candidates (where the device has them), so the chosen result is
# compared with them in the same run rather than assumed to beat them.
PEERS: tuple[str, ...] = ("inductor", "compile")


def available_backends(device: str) -> list[str]:
    kind = device.split(":")[0]
    if kind == "xla":
        return ["xla"] if xla_available() else []
    return ["eager", "inductor", "compile"]


def build(backend: str, gm: fx.GraphModule, inputs: tuple, workdir: Path) -> Built:
    try:
        make = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}") from None
    workdir.mkdir(parents=True, exist_ok=True)
    return make(gm, inputs, workdir)


def package_aoti(program: ExportedProgram, path: Path, *, instrumented: bool = False) -> Path:
    """Compile ahead of time so a deployment gets inductor's speed without compiling.

    Plain by default: that is what ships and what is timed. Profiler ranges around every
    kernel cost about 5 % on small models (vit_tiny, bert_mini on 2 cores), so an
    `instrumented` twin is built only to be profiled, never shipped or timed.
    """
    from contextlib import nullcontext

    from torch._inductor import aoti_compile_and_package

    from tuner.profiling.counting import inductor_kernel_ranges

    path.parent.mkdir(parents=True, exist_ok=True)
    with inductor_kernel_ranges() if instrumented else nullcontext():
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
