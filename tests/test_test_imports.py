"""No module under tests/ imports a test module (test_*.py).

A test module that imports another runs the other's module code, and its fixtures, wherever it
is collected, and ties the two files' places together: shared models, fakes and fixtures live in
helper modules (tests/**/*helpers.py, tests/tuner/tuning_fixtures.py, ...) and conftest.py files.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, dotted name) of every import in the file, at any depth, relative ones resolved;
    `from a import b` gives both `a` and `a.b` (b may be a module)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def imports_of_test_modules(root: Path) -> list[str]:
    """`path:line imports name` for each import under `root` of a test module under `root`."""
    files = sorted(root.rglob("*.py"))
    test_modules = {_module_name(p, root) for p in files if p.name.startswith("test_")}
    bad: list[str] = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        module = _module_name(path, root)
        for line, name in _imported(tree, module, path.name == "__init__.py"):
            if name in test_modules:
                bad.append(f"{path.relative_to(root.parent)}:{line} imports {name}")
    return bad


def test_no_module_under_tests_imports_a_test_module() -> None:
    assert imports_of_test_modules(TESTS) == []


def test_the_scan_finds_each_form_of_import(tmp_path: Path) -> None:
    """Control: absolute, `from package import module`, relative and function-level imports of a
    test module are all found; importing a helper is not."""
    root = tmp_path / "tests"
    (root / "a").mkdir(parents=True)
    for name in ("__init__.py", "a/__init__.py", "a/helpers.py", "a/test_one.py"):
        (root / name).write_text("")
    (root / "a" / "test_two.py").write_text(
        "import tests.a.test_one\n"
        "from tests.a import test_one\n"
        "from .test_one import x\n"
        "from . import helpers\n"
        "from tests.a.helpers import y\n"
        "def f():\n"
        "    from tests.a.test_one import z\n"
    )
    assert imports_of_test_modules(root) == [
        "tests/a/test_two.py:1 imports tests.a.test_one",
        "tests/a/test_two.py:2 imports tests.a.test_one",
        "tests/a/test_two.py:3 imports tests.a.test_one",
        "tests/a/test_two.py:7 imports tests.a.test_one",
    ]
