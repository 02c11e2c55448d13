"""Runtime artifacts as data: what the service's check and a deployment refuse (no torch)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tuner.backends.runtime_files import (
    IR_BIN,
    IR_XML,
    check_artifact,
    check_openvino_xml,
    read_openvino_zip,
)
from tuner.contract.errors import UnsafeArtifactError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


def _relu_model(**graph: object) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 3], [1.0] * 6)
    nodes = [helper.make_node("Add", ["x", "w"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    g = helper.make_graph(nodes, "g", [x], [y], initializer=[w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], **graph)


def _saved(model: onnx.ModelProto, path: Path) -> Path:
    path.write_bytes(model.SerializeToString())
    return path


def test_a_plain_onnx_file_passes(tmp_path: Path) -> None:
    check_artifact("onnxruntime", _saved(_relu_model(), tmp_path / "ok.onnx"))


def test_an_onnx_file_with_an_external_data_path_is_refused(tmp_path: Path) -> None:
    """The runtime would open the path the file names (here, a file of this machine's)."""
    model = _relu_model()
    w = model.graph.initializer[0]
    w.ClearField("float_data")
    w.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../../etc/passwd"), ("offset", "0"), ("length", "24")):
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    with pytest.raises(UnsafeArtifactError, match=r"external data.*etc/passwd"):
        check_artifact("onnxruntime", _saved(model, tmp_path / "ext.onnx"))


def test_an_onnx_file_with_a_custom_operator_domain_is_refused(tmp_path: Path) -> None:
    """A custom domain needs a custom-op library: never loaded."""
    model = _relu_model()
    model.opset_import.append(helper.make_opsetid("com.evil", 1))
    model.graph.node[1].domain = "com.evil"
    with pytest.raises(UnsafeArtifactError, match=r"com\.evil.*custom operators"):
        check_artifact("onnxruntime", _saved(model, tmp_path / "custom.onnx"))


def test_a_custom_domain_hidden_in_a_subgraph_is_refused(tmp_path: Path) -> None:
    model = _relu_model()
    then = helper.make_graph(
        [helper.make_node("Mystery", ["x"], ["t"], domain="com.evil")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2, 3])],
    )
    cond = helper.make_tensor("c", TensorProto.BOOL, [], [True])
    model.graph.initializer.append(cond)
    model.graph.node.append(
        helper.make_node("If", ["c"], ["z"], then_branch=then, else_branch=then)
    )
    with pytest.raises(UnsafeArtifactError, match=r"com\.evil"):
        check_artifact("onnxruntime", _saved(model, tmp_path / "nested.onnx"))


def test_what_is_not_an_onnx_file_is_refused(tmp_path: Path) -> None:
    bogus = tmp_path / "x.onnx"
    bogus.write_bytes(b"\xff" * 64)
    with pytest.raises(UnsafeArtifactError):
        check_artifact("onnxruntime", bogus)


IR = b"""<?xml version="1.0"?>
<net name="m" version="11">
  <layers>
    <layer id="0" name="x" type="Parameter" version="opset1">
      <data shape="2" element_type="f32"/>
    </layer>
    <layer id="1" name="w" type="Const" version="opset1">
      <data element_type="f32" shape="2" offset="0" size="8"/>
    </layer>
    <layer id="2" name="add" type="Add" version="%s"/>
  </layers>
</net>
"""


def _ir_zip(path: Path, xml: bytes, weights: bytes = b"\0" * 8, extra: bool = False) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(IR_XML, xml)
        z.writestr(IR_BIN, weights)
        if extra:
            z.writestr("libcustom.so", b"\x7fELF")
    return path


def test_a_standard_ir_zip_passes(tmp_path: Path) -> None:
    xml, weights = read_openvino_zip(_ir_zip(tmp_path / "ok.zip", IR % b"opset1"))
    assert weights == b"\0" * 8 and b"<net" in xml


@pytest.mark.parametrize(
    ("xml", "weights", "why"),  # `why`: a regular expression
    [
        (IR % b"extension", b"\0" * 8, "not a standard opset"),
        (IR % b"opset1", b"\0" * 4, "outside|of a 4-byte weights file"),
        (b'<!DOCTYPE net [<!ENTITY e SYSTEM "file:///etc/passwd">]>' + IR % b"opset1", b"", "DTD"),
        ((IR % b"opset1").replace(b"<layers>", b"<extensions/><layers>"), b"\0" * 8, "extensions"),
        (b"<net version='7'><layers/></net>", b"", "version"),
    ],
    ids=["custom layer", "weights out of range", "entities", "extensions", "old IR"],
)
def test_an_ir_that_is_not_plain_data_is_refused(xml: bytes, weights: bytes, why: str) -> None:
    with pytest.raises(UnsafeArtifactError, match=why):
        check_openvino_xml(xml, len(weights))


def test_an_ir_zip_with_anything_else_in_it_is_refused(tmp_path: Path) -> None:
    path = _ir_zip(tmp_path / "x.zip", IR % b"opset1", extra=True)
    with pytest.raises(UnsafeArtifactError, match="exactly"):
        check_artifact("openvino", path)


def test_an_unknown_runtime_kind_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeArtifactError, match="no runtime artifact"):
        check_artifact("tvm", _saved(_relu_model(), tmp_path / "m.onnx"))
