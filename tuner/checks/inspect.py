"""The service's checks of untrusted programs, as a child process entry point.

The service never builds a graph from an upload in its own process: `python -m tuner.checks.inspect`
runs in a short-lived, resource-capped, sandboxed child (`service.analysis`) and writes one JSON
object to the file named by `--out`:

    fingerprint PROGRAM --out R.json                      {"fingerprint": ..., "footprint": [...]}
    load PROGRAM --out R.json                             {"loaded": true}
    verify ORIGINAL TUNED --config C.json --out R.json    {"mismatch": null | "why"}
    runtime RUNTIME FILE --out R.json                     {"checked": true | false, ...}
    warm        import everything first, then run one of the above read from stdin (`checks.warm`)

Exit codes are the tuner's (`tuner.contract.exit_codes`): 2 for a bad program, 3 for a refused one
(the message on stderr names the node or field; running out of memory under the child's cap
counts as refused, as a resource bomb the static bounds missed), 1 for a bug: the service then
answers with a 5xx, never with "bad upload".
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuner.checks.warm import serve_one
from tuner.contract.errors import FxtuneError
from tuner.contract.exit_codes import ExitCode, exit_code_for


def inspect_program(path: Path) -> dict[str, Any]:
    """The upload's fingerprint and resource footprint; refuses what `load_bounded` refuses."""
    from tuner.graph.fingerprint import model_fingerprint
    from tuner.loading.bounds import Bounds, check_bounds, physical_memory_bytes
    from tuner.loading.load import load_program

    program = load_program(path)
    footprint = check_bounds(program, Bounds.for_host(physical_memory_bytes()))
    return {
        "fingerprint": model_fingerprint(program),
        "footprint": [asdict(f) for f in footprint],
    }


def _load(path: Path) -> dict[str, Any]:
    """A worker's tuned program: it loads and its module builds (no bounds: it was run)."""
    from tuner.loading.load import load_program

    load_program(path).module()
    return {"loaded": True}


def _verify(original: Path, tuned: Path, config_path: Path) -> dict[str, Any]:
    from tuner.checks.verify_result import verify_tuned

    return {"mismatch": verify_tuned(original, tuned, json.loads(config_path.read_text()))}


def warm_up() -> None:
    """What a first check would otherwise import: the checks, torch, and torch's program
    deserializer, which the loader imports on first use (it brings TorchDynamo: a second)."""
    from tuner.host.torch_compat import private

    private("torch._export.serde.serialize")
    import tuner.checks.verify_result
    import tuner.graph.fingerprint
    import tuner.loading.bounds
    import tuner.loading.load  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tuner.checks.inspect")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("warm")
    for name in ("fingerprint", "load"):
        one = sub.add_parser(name)
        one.add_argument("program", type=Path)
        one.add_argument("--out", type=Path, required=True)
    rt = sub.add_parser("runtime")
    rt.add_argument("runtime", choices=("openvino", "onnxruntime"))
    rt.add_argument("artifact", type=Path)
    rt.add_argument("--out", type=Path, required=True)
    ver = sub.add_parser("verify")
    ver.add_argument("original", type=Path)
    ver.add_argument("tuned", type=Path)
    ver.add_argument("--config", type=Path, required=True)
    ver.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "warm":
        return serve_one(main, warm_up)
    try:
        if args.command == "fingerprint":
            result = inspect_program(args.program)
        elif args.command == "load":
            result = _load(args.program)
        elif args.command == "runtime":
            from tuner.checks.runtime_artifact import check_runtime_artifact

            result = check_runtime_artifact(args.runtime, args.artifact)
        else:
            result = _verify(args.original, args.tuned, args.config)
    except FxtuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exit_code_for(exc))
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        print("error: refused: it ran out of memory within the check's limit", file=sys.stderr)
        return int(ExitCode.REFUSED)
    args.out.write_text(json.dumps(result))
    return 0


def out_of_memory(exc: BaseException) -> bool:
    """Python's MemoryError, or torch's CPU allocator failing (a plain RuntimeError, told apart
    only by its message) or its OutOfMemoryError."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    return isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc)


if __name__ == "__main__":
    raise SystemExit(main())
