"""Export the example models to `.pt2` files: `python -m examples.build OUT_DIR`."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from examples.models import EXAMPLES
from tuner.graph.capture import export_module, save_program


def build(name: str, out_dir: Path | str) -> Path:
    """Export one example with its sample inputs inside, as `OUT_DIR/<name>.pt2`."""
    example = EXAMPLES[name]()
    program = export_module(example.module, example.example_inputs)
    return save_program(program, Path(out_dir) / f"{name}.pt2")


def build_all(out_dir: Path | str, names: Iterable[str] | None = None) -> dict[str, Path]:
    return {name: build(name, out_dir) for name in (EXAMPLES if names is None else names)}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m examples.build OUT_DIR", file=sys.stderr)
        return 2
    for name, path in build_all(args[0]).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
