"""ONNX Runtime as a backend: the program exported to ONNX, run by an InferenceSession.

The file is written by torch's own exporter (`torch.onnx.export(program, dynamo=True)`), in one
piece (no external data), from the program as fxtune transformed it; the static sizes stay
static and the program's dynamic dimensions become the file's symbolic ones. The session runs
with every graph optimization ONNX Runtime has and as many intra-op threads as the tuning run
(one inter-op thread: a forward is one call), on the CPU execution provider only.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path
from typing import Any

import numpy as np
from torch.export import ExportedProgram

from tuner.backends.runtime_runner import InputSig, NotForRuntime, RuntimeRunner
from tuner.graph.capture import example_inputs

# ONNX Runtime's input types, as numpy dtypes.
ORT_TYPES: dict[str, np.dtype] = {
    f"tensor({name})": np.dtype(dtype)
    for name, dtype in (
        ("float", "float32"),
        ("double", "float64"),
        ("float16", "float16"),
        ("int64", "int64"),
        ("int32", "int32"),
        ("int16", "int16"),
        ("int8", "int8"),
        ("uint8", "uint8"),
        ("bool", "bool"),
    )
}


def write_onnx(program: ExportedProgram, path: Path) -> Path:
    """Export `program` to one ONNX file (the exporter's progress lines are kept off stdout)."""
    import torch

    with contextlib.redirect_stdout(io.StringIO()):
        onnx_program = torch.onnx.export(
            program, tuple(example_inputs(program)), dynamo=True, external_data=False
        )
        if onnx_program is None:
            raise RuntimeError("torch.onnx.export returned no program")
        onnx_program.save(str(path), external_data=False)
    return path


def session(model: Path | bytes, threads: int) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _sig(arg: Any) -> InputSig:
    dtype = ORT_TYPES.get(arg.type)
    if dtype is None:
        raise NotForRuntime(f"ONNX input {arg.name!r} is of type {arg.type}, not one fxtune feeds")
    dims = tuple(d if isinstance(d, int) else None for d in arg.shape)
    return InputSig(arg.name, dtype, dims)


def onnx_runner(model: Path | bytes, out_spec: Any, threads: int) -> RuntimeRunner:
    """A runner over a session of `model` (a file, or its bytes)."""
    sess = session(model, threads)
    sigs = [_sig(a) for a in sess.get_inputs()]
    names = [s.name for s in sigs]

    def call(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return sess.run(None, dict(zip(names, arrays, strict=True)))

    return RuntimeRunner("onnxruntime", call, sigs, out_spec)
