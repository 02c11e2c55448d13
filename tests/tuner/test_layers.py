"""The tuner's architecture as a test: each subpackage is a layer, and imports only run down.

A newcomer reads the tree in this order; a module may import from its own layer or any below it,
never from above, and no two modules import each other (directly or round a longer circle),
counting imports inside functions too. The thin modules kept at the top for documented names
(`tuner.client`, `tuner.config`, `tuner.buckets`) and the CLI sit above everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

TUNER = Path(__file__).resolve().parents[2] / "tuner"

LAYERS = [
    "contract",
    "host",
    "graph",
    "loading",
    "passes",
    "measure",
    "profiling",
    "backends",
    "training",
    "search",
    "deploy",
    "tuning",
    "distributed",
    "checks",
    "(top)",  # cli.py and the documented re-exports
]
TOP = {"cli", "client", "config", "buckets"}


def module_name(path: Path) -> str:
    parts = path.relative_to(TUNER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in TOP:
        return "(top)"
    return parts[1]


def tuner_imports(path: Path) -> set[str]:
    """Every tuner module `path` imports, at module level or inside functions."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("tuner.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            if mod == "tuner" or mod.startswith("tuner."):
                found.add(mod)
                found |= {f"{mod}.{a.name}" for a in node.names}
    return found


def graph() -> nx.DiGraph:
    modules = {module_name(p): p for p in TUNER.rglob("*.py")}
    g = nx.DiGraph()
    g.add_nodes_from(modules)
    for name, path in modules.items():
        for target in tuner_imports(path):
            if target in modules and target != name:
                g.add_edge(name, target)
    return g


def test_every_module_is_in_a_layer() -> None:
    unknown = sorted(m for m in graph() if layer_of(m) not in LAYERS)
    assert unknown == [], "add the subpackage to LAYERS (and to tuner/__init__.py's docstring)"


def test_no_import_runs_up_a_layer() -> None:
    rank = {name: i for i, name in enumerate(LAYERS)}
    up = sorted(
        f"{a} -> {b}"
        for a, b in graph().edges
        if b != "tuner" and rank[layer_of(b)] > rank[layer_of(a)]
    )
    assert up == []


def test_no_import_circles() -> None:
    g = graph()
    # A package's __init__ re-exporting its own modules is not a circle of the design.
    g.remove_edges_from([(a, b) for a, b in g.edges if b.startswith(a + ".") or a == "tuner"])
    circles = sorted(" -> ".join(c) for c in nx.simple_cycles(g))
    assert circles == []


@pytest.mark.parametrize(
    "module", ["tuner.contract.config", "tuner.contract.errors", "tuner.contract.hardware"]
)
def test_the_contract_imports_without_torch(module: str) -> None:
    import subprocess
    import sys

    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_contracts_optimizers_are_the_ones_training_builds() -> None:
    from tuner.contract.training import OPTIMIZER_NAMES
    from tuner.training.step import OPTIMIZERS

    assert sorted(OPTIMIZERS) == list(OPTIMIZER_NAMES)
