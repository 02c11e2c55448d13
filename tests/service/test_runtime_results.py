"""A worker's result with a runtime artifact: stored only as data, served by the digest its
config names (SQLite only: the store is untouched, the artifact lives in the blob store).

The artifacts are small hand-made ONNX files and IR zips (the service checks what they hold,
not what they compute); the deployment client checks outputs (tests/tuner/deploy).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.core.config import Settings
from service.main import create_app
from tests.service.fakes import config, program_fingerprint, upload_parts, write_result
from tests.service.helpers import LOCAL, tiny_program
from tests.service.in_process_checks import in_process_checks

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("programs") / "tiny.pt2"
    tiny_program(path)
    return path


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path}/f.db")
    app = create_app(settings, checks=in_process_checks)
    with TestClient(app, base_url=LOCAL, client=("127.0.0.1", 40000)) as c:
        yield c


def _onnx(tmp_path: Path, *, external: bool = False, domain: str = "") -> Path:
    w = helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0])
    if external:
        w.ClearField("float_data")
        w.data_location = TensorProto.EXTERNAL
        entry = w.external_data.add()
        entry.key, entry.value = "location", "../../secrets"
    node = helper.make_node("Add", ["x", "w"], ["y"], domain=domain)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[w],
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    path = tmp_path / "tuned.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=opsets).SerializeToString())
    return path


def _ir_zip(tmp_path: Path, version: str) -> Path:
    xml = f"""<?xml version="1.0"?><net name="m" version="11"><layers>
    <layer id="0" name="x" type="Parameter" version="opset1"><data shape="2" element_type="f32"/>
    </layer><layer id="1" name="y" type="MyCustomOp" version="{version}"/></layers></net>"""
    path = tmp_path / "tuned.openvino.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("model.xml", xml)
        z.writestr("model.bin", b"")
    return path


def _result(tmp_path: Path, program: Path, runtime: str, artifact: Path) -> dict[str, Path]:
    cfg = config(program_fingerprint(program))
    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()
    formats = {"onnxruntime": "onnx", "openvino": "openvino-ir-zip"}
    cfg.update(
        schema_version=5,
        backend=runtime,
        runtime={"runtime": runtime, "version": "1", "format": formats[runtime], "sha256": digest},
    )
    files = write_result(tmp_path / "out", program, cfg)
    report = json.loads(files["report"].read_text())
    report["artifacts"]["runtime"] = artifact.name
    files["report"].write_text(json.dumps(report))
    return {**files, "runtime": artifact}


def _claimed(client: TestClient, program: Path) -> dict[str, Any]:
    with program.open("rb") as f:
        model = client.post("/api/v1/models", files={"file": ("t.pt2", f)}, data={"tune": "true"})
    assert model.status_code == 201, model.text
    job = client.post("/api/v1/jobs/claim", json={"worker_id": "w", "device": "cpu"})
    assert job.status_code == 200, job.text
    return {**job.json(), "model_id": model.json()["id"]}


def _complete(client: TestClient, job: dict[str, Any], files: dict[str, Path]) -> Any:
    return client.post(
        f"/api/v1/jobs/{job['job']['id']}/complete",
        data={"lease_token": job["lease_token"]},
        files=upload_parts(files),
    )


def test_an_onnx_artifact_is_stored_and_served_by_its_digest(
    client: TestClient, program: Path, tmp_path: Path
) -> None:
    job = _claimed(client, program)
    artifact = _onnx(tmp_path)
    resp = _complete(client, job, _result(tmp_path, program, "onnxruntime", artifact))
    assert resp.status_code == 200, resp.text
    digest = hashlib.sha256(artifact.read_bytes()).hexdigest()
    fp = program_fingerprint(program)
    got = client.get(f"/api/v1/configs/{fp}/runtime", params={"sha256": digest})
    assert got.status_code == 200 and got.content == artifact.read_bytes()
    other = client.get(f"/api/v1/configs/{fp}/runtime", params={"sha256": "0" * 64})
    assert other.status_code == 404
    model = job["model_id"]
    by_model = client.get(f"/api/v1/models/{model}/artifact", params={"format": "runtime"})
    assert by_model.content == artifact.read_bytes()
    report = client.get(f"/api/v1/models/{model}/report").json()
    assert report["artifacts"]["runtime"].endswith("format=runtime")


@pytest.mark.parametrize(
    ("runtime", "make", "why"),
    [
        ("onnxruntime", lambda p: _onnx(p, external=True), "external data"),
        ("onnxruntime", lambda p: _onnx(p, domain="com.evil"), "custom operators"),
        ("openvino", lambda p: _ir_zip(p, "my_extension"), "not a standard opset"),
    ],
    ids=["onnx external data", "onnx custom domain", "openvino custom layer"],
)
def test_an_artifact_that_is_not_plain_data_fails_the_result(
    client: TestClient, program: Path, tmp_path: Path, runtime: str, make: Any, why: str
) -> None:
    job = _claimed(client, program)
    resp = _complete(client, job, _result(tmp_path, program, runtime, make(tmp_path)))
    assert resp.status_code == 422 and why in resp.json()["detail"], resp.text
    assert client.get(f"/api/v1/jobs/{job['job']['id']}").json()["status"] == "running"


def test_an_artifact_other_than_the_one_its_config_names_is_refused(
    client: TestClient, program: Path, tmp_path: Path
) -> None:
    job = _claimed(client, program)
    files = _result(tmp_path, program, "onnxruntime", _onnx(tmp_path))
    files["runtime"].write_bytes(files["runtime"].read_bytes() + b"\0")
    resp = _complete(client, job, files)
    assert resp.status_code == 422 and "not the one its config names" in resp.text
