"""What `pip install fxtune` asks of a host, and what this project's own installs pin."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]


def torch_requirement() -> Requirement:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return next(r for r in map(Requirement, project["dependencies"]) if r.name == "torch")


def test_the_package_accepts_the_torch_a_gpu_image_ships() -> None:
    """A GPU host's CUDA torch (2.11 on the H100 image) must not be replaced on install."""
    spec = torch_requirement().specifier
    assert {"2.11.0", "2.12.1", "2.13.0"} <= set(spec.filter(["2.11.0", "2.12.1", "2.13.0"]))
    assert not spec.contains("2.10.0") and not spec.contains("2.14.0")


def test_the_projects_own_installs_pin_the_tested_torch() -> None:
    pins = [
        Requirement(line)
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    torch = next(r for r in pins if r.name == "torch")
    assert str(torch.specifier) == "==2.13.0"
    assert torch_requirement().specifier.contains("2.13.0")
    assert "torch==2.13.0" in (REPO / "Makefile").read_text()
