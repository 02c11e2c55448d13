"""OpenVINO as a backend: the program converted by `openvino.convert_model`, compiled for the CPU.

The model is converted from the exported program itself, then given the program's input
shapes: static sizes static (OpenVINO's converter leaves every size dynamic, and a static model
compiles to faster kernels) and dynamic dimensions with their ranges. It is compiled with the
latency hint, f32 inference precision (on CPUs with bf16 or AMX OpenVINO would otherwise
compute in bf16: not the original's answers) and the tuning run's thread count. It ships as IR
(`model.xml` and `model.bin`) in one zip (`tuner.backends.runtime_files`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from torch.export import ExportedProgram

from tuner.backends.runtime_files import pack_openvino_ir, read_openvino_zip
from tuner.backends.runtime_runner import InputSig, NotForRuntime, RuntimeRunner


def compile_config(threads: int) -> dict[str, str]:
    return {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": "f32",
        "INFERENCE_NUM_THREADS": str(threads),
    }


def _partial_shapes(program: ExportedProgram) -> list[Any]:
    """Per user input of the program: its sizes, a range where a size is symbolic."""
    import openvino as ov
    import torch

    user = set(program.graph_signature.user_inputs)
    shapes = []
    for node in program.graph.find_nodes(op="placeholder"):
        if node.name not in user:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise NotForRuntime(f"input {node.name} is not a tensor: OpenVINO takes tensors only")
        dims = []
        for size in value.shape:
            if isinstance(size, int):
                dims.append(ov.Dimension(size))
                continue
            bounds = program.range_constraints.get(size.node.expr)
            low = int(bounds.lower) if bounds is not None else 0
            high = bounds.upper if bounds is not None else None
            top = int(high) if high is not None and high.is_finite else -1
            dims.append(ov.Dimension(low, top))
        shapes.append(ov.PartialShape(dims))
    return shapes


def write_openvino_ir(program: ExportedProgram, path: Path) -> Path:
    """Convert `program` and write its IR, zipped, to `path`."""
    import openvino as ov

    model = ov.convert_model(program)
    shapes = _partial_shapes(program)
    if len(shapes) != len(model.inputs):
        raise NotForRuntime(
            f"OpenVINO's model has {len(model.inputs)} inputs, the program {len(shapes)}"
        )
    model.reshape(dict(zip(model.inputs, shapes, strict=True)))
    with tempfile.TemporaryDirectory(prefix="fxtune-ir-") as tmp:
        xml = Path(tmp) / "model.xml"
        ov.save_model(model, str(xml), compress_to_fp16=False)
        return pack_openvino_ir(xml, xml.with_suffix(".bin"), path)


def _sig(port: Any, index: int) -> InputSig:
    shape = port.get_partial_shape()
    dims = tuple(d.get_length() if d.is_static else None for d in shape)
    names = port.get_names()
    name = sorted(names)[0] if names else f"input{index}"
    return InputSig(name, np.dtype(port.get_element_type().to_dtype()), dims)


def openvino_runner(xml: bytes, weights: bytes, out_spec: Any, threads: int) -> RuntimeRunner:
    """A runner over the IR compiled for the CPU (see `compile_config`)."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(model=xml, weights=ov.Tensor(np.frombuffer(weights, np.uint8)))
    compiled = core.compile_model(model, "CPU", compile_config(threads))
    request = compiled.create_infer_request()
    sigs = [_sig(port, i) for i, port in enumerate(compiled.inputs)]

    def call(arrays: list[np.ndarray]) -> tuple[np.ndarray, ...]:
        return request.infer(arrays, share_inputs=True, share_outputs=False).to_tuple()

    return RuntimeRunner("openvino", call, sigs, out_spec)


def openvino_zip_runner(path: Path, out_spec: Any, threads: int) -> RuntimeRunner:
    xml, weights = read_openvino_zip(path)
    return openvino_runner(xml, weights, out_spec, threads)
