"""A digest of the code a module runs: its source plus that of every module it imports from its
own package, transitively, plus the torch version.

Pass versions key the decision cache. Hashing only the pass's own file kept stale decisions
after a fix in a shared helper (tuner.graph.nodes, tuner.graph.sites), and a decision measured under
one torch need not hold under another. Imports are read from the source (every `import` statement,
function-level ones included), not from what happens to be loaded, so the digest does not depend
on import order. Modules loaded dynamically (importlib) are not followed.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
from pathlib import Path

import torch


def _origin(name: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # "pkg.module.function": not a module
        return None
    if spec is None or spec.origin is None or not spec.has_location:
        return None
    return Path(spec.origin)


def _read(path: Path) -> bytes:
    return path.read_bytes()


def _imported(name: str, source: bytes, is_package: bool) -> set[str]:
    """Every module name an import statement in `source` may refer to."""
    names: set[str] = set()
    here = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = importlib.util.resolve_name("." * node.level + base, here)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import mod`
    return names


def module_closure(name: str, packages: tuple[str, ...]) -> dict[str, bytes]:
    """`name` and the modules of `packages` it imports, transitively: module name -> source."""
    found: dict[str, bytes] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        origin = _origin(current)
        if origin is None:
            continue
        found[current] = source = _read(origin)
        is_package = origin.name == "__init__.py"
        for imported in _imported(current, source, is_package):
            if imported.partition(".")[0] in packages:
                todo.append(imported)
    if name not in found:
        raise LookupError(f"no source for module {name!r}: cannot tell when it changes")
    return found


def source_digest(name: str, packages: tuple[str, ...]) -> str:
    digest = hashlib.sha256(f"torch {torch.__version__}\n".encode())
    for module, source in sorted(module_closure(name, packages).items()):
        digest.update(f"{module} {len(source)}\n".encode())
        digest.update(source)
    return digest.hexdigest()
