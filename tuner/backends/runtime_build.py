"""Building a runtime backend's candidate: the artifact in a child, its runner in the tuner.

A runtime converts the program with its own native code (OpenVINO's converter, torch's ONNX
exporter and the runtime's graph optimizer), which can hang or crash on a graph nobody wrote it
for: so the artifact is written in a compile child (`tuner.backends.isolation`), stopped when
its time is up, which also loads it and runs it once. The tuner then loads the file the child
wrote: what is timed is the artifact that ships. Inference only: a program that mutates its
buffers, takes non-tensor inputs or is a training step is not offered to a runtime.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.backends.runtime_runner import NotForRuntime, RuntimeRunner
from tuner.backends.runtimes import RUNTIMES
from tuner.graph.nodes import TRAIN_KEY, mutated_aliases

__all__ = [
    "NotForRuntime",
    "RuntimeBuild",
    "build_runtime",
    "load_runner",
    "refusal",
    "write_artifact",
]

if TYPE_CHECKING:
    from tuner.backends.isolation import Children


@dataclass(frozen=True)
class RuntimeKind:
    """How one runtime's artifact is written (from a program) and loaded (into a runner)."""

    write: Callable[[ExportedProgram, Path], Path]
    load: Callable[[Path, Any, int], RuntimeRunner]


def _onnx_kind() -> RuntimeKind:
    from tuner.backends.onnx_backend import onnx_runner, write_onnx

    return RuntimeKind(write_onnx, onnx_runner)


def _openvino_kind() -> RuntimeKind:
    from tuner.backends.openvino_backend import openvino_zip_runner, write_openvino_ir

    return RuntimeKind(write_openvino_ir, openvino_zip_runner)


KINDS: dict[str, Callable[[], RuntimeKind]] = {
    "onnxruntime": _onnx_kind,
    "openvino": _openvino_kind,
}


def refusal(program: ExportedProgram, train: bool = False) -> str | None:
    """Why `program` is not offered to a runtime (None: it is)."""
    if train:
        return "a training step: the runtimes run inference only"
    signature = program.graph_signature
    written = mutated_aliases(program.graph_module)  # in-place ops stay in export's graph
    placeholders = set(program.graph.find_nodes(op="placeholder"))
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate or written & placeholders:
        return "it mutates its buffers or inputs in place, which a runtime's graph cannot"
    user = set(signature.user_inputs)
    for node in program.graph.find_nodes(op="placeholder"):
        if node.name not in user:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            return f"input {node.name} is not a tensor"
        if value.dtype in (torch.bfloat16, torch.complex64, torch.complex128):
            return f"input {node.name} is {value.dtype}, which the runtimes are not fed"
    return None


def load_runner(runtime: str, artifact: Path, out_spec: Any, threads: int) -> RuntimeRunner:
    return KINDS[runtime]().load(artifact, out_spec, threads)


def write_artifact(runtime: str, program: ExportedProgram, artifact: Path) -> Path:
    """The runtime's artifact of `program` at `artifact` (in this process: the child's job)."""
    why = refusal(program)
    if why is not None:
        raise NotForRuntime(f"not offered to {runtime}: {why}")
    return KINDS[runtime]().write(program, artifact)


@dataclass(frozen=True)
class RuntimeBuild:
    """A runtime candidate's runner over its artifact, and what building it took (the
    registry's `Built`)."""

    runner: RuntimeRunner
    artifact: Path
    compile_s: float
    overhead_s: float


def build_runtime(
    runtime: str,
    gm: fx.GraphModule,
    inputs: tuple,
    workdir: Path,
    timeout_s: float | None,
    children: Children | None = None,
) -> RuntimeBuild:
    """The candidate's runner over the artifact of `gm` (re-exported with the original's
    dynamic dimensions); with `timeout_s`, written in a child stopped after that long."""
    from tuner.graph.capture import to_program

    program = to_program(gm, tuple(inputs))
    why = refusal(program, train=bool(gm.meta.get(TRAIN_KEY)))
    if why is not None:
        raise NotForRuntime(f"not offered to {runtime}: {why}")
    stem = workdir / uuid.uuid4().hex
    artifact = stem.with_suffix(RUNTIMES[runtime].suffix)
    threads = torch.get_num_threads()
    out_spec = program.call_spec.out_spec
    if timeout_s is None:
        started = time.monotonic()
        write_artifact(runtime, program, artifact)
        compile_s = time.monotonic() - started
        return RuntimeBuild(
            load_runner(runtime, artifact, out_spec, threads), artifact, compile_s, 0.0
        )
    from tuner.backends.isolation import runtime_in_child

    torch.export.save(program, stem.with_suffix(".pt2"))
    done = runtime_in_child(
        stem.with_suffix(".pt2"), runtime, artifact, timeout_s=timeout_s, children=children
    )
    overhead = max(done.seconds - done.compile_s, 0.0)
    runner = load_runner(runtime, done.package, out_spec, threads)
    return RuntimeBuild(runner, done.package, done.compile_s, overhead)
