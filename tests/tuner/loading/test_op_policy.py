"""The operator allowlist admits functional collectives, and still refuses host effects."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crafted import from_file_graph
from tuner.contract.errors import UnsafeArtifactError
from tuner.graph.capture import to_graph_module
from tuner.loading.load import load_program
from tuner.loading.op_policy import refusal


def test_a_saved_sharded_program_loads(sharded_2: str) -> None:
    for rank in range(2):
        gm = to_graph_module(load_program(sharded_2.format(rank=rank)))
        targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
        assert "_c10d_functional.all_to_all_single.default" in targets
        assert "_c10d_functional.wait_tensor.default" in targets


def test_collectives_allowed_host_effects_and_other_namespaces_not() -> None:
    assert refusal("torch.ops._c10d_functional.all_to_all_single.default") is None
    assert refusal("torch.ops._c10d_functional.wait_tensor.default") is None
    assert refusal("torch.ops.aten.from_file.default") is not None
    assert refusal("torch.ops.c10d.send.default") is not None  # the non-functional namespace
    assert refusal("torch.ops._c10d_functional_evil.x.default") is not None


def test_from_file_still_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim.bin"
    victim.write_bytes(bytes(range(16)))
    crafted = from_file_graph(tmp_path / "from_file.pt2", victim)
    with pytest.raises(UnsafeArtifactError, match=r"aten\.from_file.*host"):
        load_program(crafted)
