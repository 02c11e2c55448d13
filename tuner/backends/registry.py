"""Backends a tuned module can run under, by name: eager FX, inductor, XLA where installed,
on CUDA the same captured in CUDA graphs, and on the CPU OpenVINO and ONNX Runtime where
installed (`tuner.backends.runtimes`)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn
from torch.export import ExportedProgram

from tuner.backends.runtimes import RUNTIMES, installed_version, is_runtime
from tuner.contract.device import Device

if TYPE_CHECKING:
    from tuner.backends.isolation import Children

Runner = Callable[..., Any]


@dataclass
class Built:
    """A runnable form of a module; `package` is the file that ships with it when one was
    made (the AOTInductor package; a runtime's artifact, `tuner.backends.runtime_build`).

    `compile_s` and `overhead_s` are what a compile in a child process took (the compile, and
    starting the child around it), for compile-time estimates; None where nothing was compiled
    ahead of time.
    """

    runner: Runner
    package: Path | None = None
    compile_s: float | None = None
    overhead_s: float | None = None


def _eager(
    gm: fx.GraphModule,
    inputs: tuple,
    workdir: Path,
    timeout_s: float | None,
    children: Children | None = None,
) -> Built:
    return Built(gm)


def _inductor(
    gm: fx.GraphModule,
    inputs: tuple,
    workdir: Path,
    timeout_s: float | None,
    children: Children | None = None,
    settings: str | None = None,
) -> Built:
    """Inductor ahead of time: what is measured is the very package a deployment loads, built
    with inductor's `settings` where named (`tuner.backends.inductor_settings`).

    (torch.compile would add guard checks per call, which on a model with dozens of inputs
    cost more than the kernels save; that is the separate "compile" backend, timed as such.)
    """
    from tuner.graph.capture import to_program

    program = to_program(gm, tuple(inputs))  # with the original's dynamic dims, if any
    stem = workdir / uuid.uuid4().hex
    if timeout_s is None:
        path = package_aoti(program, stem.with_suffix(".aoti.pt2"), settings=settings)
        return Built(load_aoti(path), path)
    from tuner.backends.isolation import compile_aoti_in_child

    torch.export.save(program, stem.with_suffix(".pt2"))
    done = compile_aoti_in_child(
        stem.with_suffix(".pt2"),
        stem.with_suffix(".aoti.pt2"),
        timeout_s=timeout_s,
        settings=settings,
        children=children,
    )
    overhead = max(done.seconds - done.compile_s, 0.0)
    return Built(load_aoti(done.package), done.package, done.compile_s, overhead)


def _compile(
    gm: fx.GraphModule,
    inputs: tuple,
    workdir: Path,
    timeout_s: float | None,
    children: Children | None = None,
) -> Built:
    """torch.compile with its defaults, as a user would run it (guards and all).

    It compiles on its first call, which the caller's output check makes before any timing;
    that compile runs in this process and cannot be stopped, so `timeout_s` is not applied
    (the caller skips it when its estimate does not fit).
    """
    return Built(torch.compile(gm))


def _compile_cudagraphs(
    gm: fx.GraphModule,
    inputs: tuple,
    workdir: Path,
    timeout_s: float | None,
    children: Children | None = None,
) -> Built:
    """torch.compile's "reduce-overhead" mode: inductor's kernels replayed from CUDA graphs
    (as `_compile`, it compiles on its first call, in this process)."""
    return Built(torch.compile(gm, mode="reduce-overhead"))


def _cudagraph(
    gm: fx.GraphModule,
    inputs: tuple,
    workdir: Path,
    timeout_s: float | None,
    children: Children | None = None,
) -> Built:
    """The module as it is (the original, or rewritten by the passes) replayed from a CUDA
    graph per input signature (`tuner.backends.cuda_graphs`); captured on its first call."""
    from tuner.backends.cuda_graphs import GraphedModule

    return Built(GraphedModule(gm))


def _xla(
    gm: fx.GraphModule,
    inputs: tuple,
    workdir: Path,
    timeout_s: float | None,
    children: Children | None = None,
) -> Built:
    return Built(torch.compile(gm, backend="openxla"))


def _runtime(name: str) -> Callable[..., Built]:
    """A runtime backend (OpenVINO, ONNX Runtime): its artifact written in a child."""

    def make(
        gm: fx.GraphModule,
        inputs: tuple,
        workdir: Path,
        timeout_s: float | None,
        children: Children | None = None,
    ) -> Built:
        from tuner.backends.runtime_build import build_runtime

        b = build_runtime(name, gm, inputs, workdir, timeout_s, children)
        return Built(b.runner, b.artifact, b.compile_s, b.overhead_s)

    return make


def xla_available() -> bool:
    try:
        import torch_xla  # noqa: F401
    except ImportError:
        return False
    return True


BACKENDS: dict[str, Callable[..., Built]] = {
    "eager": _eager,
    "inductor": _inductor,
    "compile": _compile,
    "cudagraph": _cudagraph,
    "compile-cudagraphs": _compile_cudagraphs,
    "xla": _xla,
    "openvino": _runtime("openvino"),
    "onnxruntime": _runtime("onnxruntime"),
}

# Backends per device kind. CUDA graphs exist only on CUDA; XLA only where torch_xla imports;
# the runtimes only where installed (`available_backends`).
ON_DEVICE: dict[str, tuple[str, ...]] = {
    "cpu": ("eager", "inductor", "compile", "openvino", "onnxruntime"),
    "cuda": ("eager", "inductor", "compile", "cudagraph", "compile-cudagraphs"),
    "xla": ("xla",),
}

# What a user would pick instead of fxtune: the original under each of these, timed as shipped.
# They are always whole-model candidates (where the device has them), so the chosen result is
# compared with them in the same run rather than assumed to beat them. On CUDA that includes a
# plain CUDA graph of the original and torch.compile's "reduce-overhead" (issue 11's peers), and
# on the CPU OpenVINO and ONNX Runtime (issue 48).
PEERS: tuple[str, ...] = (
    "inductor",
    "compile",
    "cudagraph",
    "compile-cudagraphs",
    "openvino",
    "onnxruntime",
)

# Backends whose runner is compiled (minutes on a big model): their compile time is estimated
# and a compile that does not fit in the budget is skipped (tuner.backends.compile_time).
COMPILING: tuple[str, ...] = (
    "inductor",
    "compile",
    "compile-cudagraphs",
    "openvino",
    "onnxruntime",
)

# Backends that run on thread pools of their own (OpenVINO's TBB, ONNX Runtime's), whose
# threads keep spinning after a call and slow whatever runs next: they are timed in blocks of
# calls (`tuner.measure.timing.Blocks`), so that cost is not charged to the other side.
OWN_THREAD_POOL: tuple[str, ...] = tuple(RUNTIMES)


def available_backends(device: Device) -> list[str]:
    if device.kind == "xla" and not xla_available():
        return []
    return [b for b in ON_DEVICE.get(device.kind, ()) if not is_runtime(b) or installed_version(b)]


# How a deployment holding the tuned module (`load_tuned`) runs it under the chosen backend:
# inductor's package is a separate artifact, so there the module is compiled by torch.compile.
DEPLOYED: dict[str, Callable[[nn.Module], nn.Module]] = {
    "inductor": lambda m: torch.compile(m),
    "compile": lambda m: torch.compile(m),
    "compile-cudagraphs": lambda m: torch.compile(m, mode="reduce-overhead"),
    "cudagraph": lambda m: _graphed(m),
}


def _graphed(module: nn.Module) -> nn.Module:
    from tuner.backends.cuda_graphs import GraphedModule

    return GraphedModule(module)


def deployed(
    backend: str, module: nn.Module, settings: str | None = None, device_kind: str = "cpu"
) -> nn.Module:
    """`module` wrapped as the backend runs it; eager (and unknown names) leave it as it is.
    Inductor's `settings` (a name) go to torch.compile as its options."""
    if backend == "inductor" and settings:
        from tuner.backends.inductor_settings import values_of

        return torch.compile(module, options=values_of(settings, device_kind))
    wrap = DEPLOYED.get(backend)
    return wrap(module) if wrap is not None else module


# Backends that build in the process that runs them (on the first call): with `probe`, a child
# builds and runs each once first (`tuner.backends.isolation.probe_in_child`), so a crash kills
# it. Not "cudagraph": it compiles nothing and replays kernels the tuner has already run in
# eager mode, so there is no compiler to crash or overrun, and on the H200 its probe (a child
# importing torch and making a CUDA context) did not fit in what a 15 s budget left, so the
# small models shipped the original, 4.5-5.3x slower than a plain CUDA graph of it.
PROBED: tuple[str, ...] = ("compile", "compile-cudagraphs")


# Backends whose ahead-of-time compile runs in a child process (`tuner.backends.isolation`):
# AOTInductor's package, and the runtimes' artifacts (`tuner.backends.runtime_build`).
CHILD_BUILT: tuple[str, ...] = ("inductor", "openvino", "onnxruntime")


def builds_in_child(backend: str, probe: bool) -> bool:
    """Whether `build` compiles `backend` in a child (`probe`: as `build`'s argument)."""
    return backend in CHILD_BUILT or (probe and backend in PROBED)


def build(
    backend: str,
    gm: fx.GraphModule,
    inputs: tuple,
    workdir: Path,
    timeout_s: float | None = None,
    probe: bool = False,
    children: Children | None = None,
    settings: str | None = None,
) -> Built:
    """A runner for `gm`; with `timeout_s`, an ahead-of-time compile runs in a child process
    and raises `tuner.backends.isolation.CompileOverrun` when it does not finish in that
    time, and with `probe` too, a backend of `PROBED` is first built and run once in a child
    (raising `CompileCrashed` if the child dies), its times recorded in the result.
    `children`: where those children come from (`tuner.backends.isolation.Children`: started
    ahead), else one is started for each. `settings`: inductor's, by name (inductor only)."""
    try:
        make = BACKENDS[backend]
    except KeyError:
        raise ValueError(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}") from None
    if settings is not None:
        if backend != "inductor":
            raise ValueError(f"inductor settings {settings!r} given for backend {backend!r}")
        make = functools.partial(_inductor, settings=settings)
    workdir.mkdir(parents=True, exist_ok=True)
    if not (probe and backend in PROBED and timeout_s is not None):
        return make(gm, inputs, workdir, timeout_s, children)
    from tuner.backends.isolation import probe_in_child
    from tuner.graph.capture import to_program

    path = workdir / f"{uuid.uuid4().hex}.probe.pt2"
    torch.export.save(to_program(gm, tuple(inputs)), path)
    probed = probe_in_child(path, backend, timeout_s=timeout_s, children=children)
    built = make(gm, inputs, workdir, timeout_s, children)
    built.compile_s, built.overhead_s = probed.compile_s, probed.seconds - probed.compile_s
    return built


def package_aoti(
    program: ExportedProgram,
    path: Path,
    *,
    instrumented: bool = False,
    settings: str | None = None,
) -> Path:
    """Compile ahead of time so a deployment gets inductor's speed without compiling.

    Plain by default: that is what ships and what is timed. Profiler ranges around every
    kernel cost about 5 % on small models (vit_tiny, bert_mini on 2 cores), so an
    `instrumented` twin is built only to be profiled, never shipped or timed. `settings`:
    inductor's, by name (`tuner.backends.inductor_settings`), for this compile only.
    """
    from contextlib import nullcontext

    from tuner.backends.inductor_settings import values_of
    from tuner.graph.capture import example_inputs
    from tuner.host.torch_compat import inductor
    from tuner.profiling.counting import inductor_kernel_ranges

    configs: dict[str, Any] = {}
    if settings:
        kinds = (x.device.type for x in example_inputs(program) if isinstance(x, torch.Tensor))
        configs = values_of(settings, next(kinds, "cpu"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with inductor_kernel_ranges() if instrumented else nullcontext():
        return Path(
            inductor.aoti_compile_and_package(
                program, package_path=str(path), inductor_configs=configs
            )
        )


# AOTInductor packages check their inputs (sizes against the static sizes and dynamic ranges
# they were compiled for, strides, device) only when this is set before their first call; without
# it, an input of another size is read as if it had the compiled size: a wrong answer, no error.
CHECK_INPUTS_ENV = "AOTI_RUNTIME_CHECK_INPUTS"


def load_aoti(path: Path) -> Runner:
    """Load a package with its input checks on (see CHECK_INPUTS_ENV): never a wrong answer.

    The flag is process-wide and read once per loaded model, so it is set before loading.
    """
    import os

    from tuner.host.torch_compat import inductor

    os.environ[CHECK_INPUTS_ENV] = "1"
    return inductor.aoti_load_package(str(path))
