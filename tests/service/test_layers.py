"""Dependencies point one way (DESIGN.md): tuner <- service, tuner <- worker; inside the service,
the API never imports the dashboard, and the service never imports the worker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FORBIDDEN = {
    "tuner": ("service", "worker"),
    "worker": ("service",),
    "service": ("worker",),
    "service/api": ("service.dashboard",),
    "service/store": ("service.api", "service.dashboard"),
}


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_points_the_wrong_way(package: str) -> None:
    bad = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in sorted((REPO / package).rglob("*.py"))
        for name in imports(path)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package])
    ]
    assert bad == []


def test_the_request_schemas_import_without_torch_or_pandas() -> None:
    """The API's schemas read the torch-free contract (tuner.contract), not the tuner itself."""
    import subprocess
    import sys

    code = (
        "import sys, service.api.schemas; "
        "print(sorted(m for m in ('torch', 'pandas', 'tuner.training') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_service_starts_without_pandas_until_a_csv_is_asked_for() -> None:
    """pandas is a second of every service start; only the CSV exports use it."""
    import subprocess
    import sys

    code = (
        "import sys; from service.main import create_app; print('pandas' in sys.modules); "
        "from service.api.routes.exports import csv_response; "
        "csv_response([{'a': 1}], ['a'], 'x.csv'); print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
