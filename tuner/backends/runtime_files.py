"""The runtimes' artifacts as data: what an ONNX file or an OpenVINO IR may hold, checked.

A runtime artifact comes from a worker, which ran an untrusted upload: the service checks it
before storing it (in its check child, `tuner.checks.inspect runtime`) and a deployment checks
it again before loading it (`tuner.deploy.runtime_module`). Both refuse what would make a
runtime read files or load code the artifact names: ONNX tensors stored as external data
(a path the runtime would open), operators of any domain but the standard ones (a custom-op
library would be needed: never loaded), model-local functions and training info; an OpenVINO
IR with layers outside the standard opsets (extensions, custom layers), DTDs or entities in
its XML, weights that point outside the weights file, or a zip with anything but
`model.xml` and `model.bin`. Nothing here imports torch or a runtime; the ONNX file is parsed
with the `onnx` package (protobuf), the IR's XML with the standard library.
"""

from __future__ import annotations

import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

from tuner.contract.errors import FxtuneError, UnsafeArtifactError

# The standard ONNX operator domains ("" and "ai.onnx" are the same one).
ONNX_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})
# An OpenVINO IR zip holds exactly these two members.
IR_XML, IR_BIN = "model.xml", "model.bin"
IR_VERSIONS = frozenset({"10", "11"})
_OPSET = re.compile(r"^opset[0-9]{1,3}$")
# Bounds before anything is read: an IR's XML is kilobytes to a few megabytes.
MAX_XML_BYTES = 64 * 1024 * 1024
MAX_WEIGHTS_BYTES = 8 * 1024**3


class ArtifactCheckUnavailable(FxtuneError):
    """This process lacks what checking the artifact needs (the `onnx` package)."""


# ---------------------------------------------------------------------------- ONNX


def _tensors_of_graph(graph: Any) -> Iterator[Any]:
    """Every tensor a graph holds, its subgraphs' (If, Loop, Scan bodies) included."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            if attr.HasField("g"):
                yield from _tensors_of_graph(attr.g)
            for sub in attr.graphs:
                yield from _tensors_of_graph(sub)


def _nodes_of_graph(graph: Any) -> Iterator[Any]:
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _nodes_of_graph(attr.g)
            for sub in attr.graphs:
                yield from _nodes_of_graph(sub)


def onnx_model_problems(model: Any) -> list[str]:
    """Why an ONNX ModelProto is not plain data a runtime may load (empty: it is)."""
    problems: list[str] = []
    external = onnx_external_location()
    for tensor in _tensors_of_graph(model.graph):
        if tensor.data_location == external or len(tensor.external_data):
            where = next((e.value for e in tensor.external_data if e.key == "location"), "?")
            problems.append(f"tensor {tensor.name!r} is stored as external data ({where!r})")
            break
    domains = {o.domain for o in model.opset_import} - ONNX_DOMAINS
    if domains:
        problems.append(f"it imports operator domains {sorted(domains)} (custom operators)")
    nodes = {n.domain for n in _nodes_of_graph(model.graph)} - ONNX_DOMAINS
    if nodes:
        problems.append(f"its nodes use operator domains {sorted(nodes)} (custom operators)")
    if len(model.functions):
        problems.append(f"it defines {len(model.functions)} model-local functions")
    if len(model.training_info):
        problems.append("it carries training info")
    return problems


def onnx_external_location() -> int:
    import onnx

    return onnx.TensorProto.EXTERNAL


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:
        raise ArtifactCheckUnavailable(
            "checking an ONNX file needs the onnx package: pip install 'fxtune[onnxruntime]'"
        ) from None
    return onnx


def load_onnx_checked(path: Path) -> Any:
    """The ONNX file's ModelProto, after it passed `onnx_model_problems` and onnx's own checker;
    UnsafeArtifactError otherwise. External data is never followed."""
    onnx = _onnx()
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and friends: not an ONNX file
        raise UnsafeArtifactError(f"{path.name} is not an ONNX model ({exc})") from None
    problems = onnx_model_problems(model)
    if problems:
        raise UnsafeArtifactError(f"{path.name} is refused: {'; '.join(problems)}")
    try:
        onnx.checker.check_model(model)
    except Exception as exc:
        raise UnsafeArtifactError(f"{path.name} fails onnx's checker: {exc}") from None
    return model


# ---------------------------------------------------------------------------- OpenVINO IR


def pack_openvino_ir(xml: Path, weights: Path, out: Path) -> Path:
    """The IR's two files in one zip (stored, not compressed: weights do not compress)."""
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.write(xml, IR_XML)
        z.write(weights, IR_BIN)
    return out


def _read_member(z: zipfile.ZipFile, info: zipfile.ZipInfo, cap: int) -> bytes:
    if info.file_size > cap:
        raise UnsafeArtifactError(f"{info.filename} declares {info.file_size} bytes: over {cap}")
    with z.open(info) as f:
        data = f.read(cap + 1)
    if len(data) > cap or len(data) != info.file_size:
        raise UnsafeArtifactError(f"{info.filename} is not the size its zip entry declares")
    return data


def read_openvino_zip(path: Path) -> tuple[bytes, bytes]:
    """(XML, weights) of an IR zip, after `check_openvino_xml`; UnsafeArtifactError otherwise."""
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise UnsafeArtifactError(f"{path.name} is not an OpenVINO IR zip ({exc})") from None
    with z:
        infos = z.infolist()
        names = sorted(i.filename for i in infos)
        if names != sorted((IR_XML, IR_BIN)):
            raise UnsafeArtifactError(
                f"{path.name} must hold exactly {IR_XML} and {IR_BIN}, not {names[:8]}"
            )
        by_name = {i.filename: i for i in infos}
        xml = _read_member(z, by_name[IR_XML], MAX_XML_BYTES)
        weights = _read_member(z, by_name[IR_BIN], MAX_WEIGHTS_BYTES)
    check_openvino_xml(xml, len(weights))
    return xml, weights


def _int(value: str | None, what: str) -> int:
    if value is None or not re.fullmatch(r"[0-9]{1,20}", value):
        raise UnsafeArtifactError(f"the IR's {what} is not a whole number: {value!r:.40}")
    return int(value)


def check_openvino_xml(xml: bytes, weights_size: int) -> None:
    """Refuse an IR whose XML declares a DTD or entities, is not IR version 10 or 11, has
    layers outside the standard opsets (an extension's, a custom layer's) or an extensions
    section, or constants whose bytes lie outside the weights."""
    lowered = xml.lower()
    if b"<!doctype" in lowered or b"<!entity" in lowered:
        raise UnsafeArtifactError("the IR's XML declares a DTD or entities")
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise UnsafeArtifactError(f"the IR's XML does not parse: {exc}") from None
    if root.tag != "net" or root.get("version") not in IR_VERSIONS:
        raise UnsafeArtifactError(
            f"not an OpenVINO IR of version {' or '.join(sorted(IR_VERSIONS))} "
            f"(<{root.tag:.20} version={root.get('version')!r:.20}>)"
        )
    if root.find(".//extensions") is not None or root.find(".//custom_layers") is not None:
        raise UnsafeArtifactError("the IR names extensions or custom layers")
    layers = list(root.iter("layer"))
    if not layers:
        raise UnsafeArtifactError("the IR has no layers")
    for layer in layers:
        version = layer.get("version") or ""
        if not _OPSET.match(version):
            raise UnsafeArtifactError(
                f"layer {layer.get('name', '?')!r:.60} of type {layer.get('type')!r:.40} is "
                f"from {version!r:.40}, not a standard opset (an extension or custom layer)"
            )
        data = layer.find("data")
        if layer.get("type") == "Const" and data is not None:
            offset = _int(data.get("offset"), "constant offset")
            size = _int(data.get("size"), "constant size")
            if offset + size > weights_size:
                name = layer.get("name", "?")
                raise UnsafeArtifactError(
                    f"constant {name!r:.60} reads bytes {offset}..{offset + size} of a "
                    f"{weights_size}-byte weights file"
                )


def check_artifact(runtime: str, path: Path) -> None:
    """Refuse `path` unless it is a data-only artifact of `runtime` (see the module notes)."""
    if runtime == "onnxruntime":
        load_onnx_checked(path)
    elif runtime == "openvino":
        read_openvino_zip(path)
    else:
        raise UnsafeArtifactError(f"no runtime artifact of kind {runtime!r:.40}")
