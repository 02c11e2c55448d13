"""The compile child's entry point (`python -m tuner.backends.child`): build, then run once.

`tuner.backends.isolation` starts it and reads its one JSON line; a crash or an overrun here
ends this process, never the tuner's.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import tempfile
import time
from pathlib import Path

# Imported by a child started ahead while it waits: torch.export.load imports dynamo (1.4 s
# here), an AOTInductor compile inductor. Private modules, so an import that fails is skipped.
WARM_IMPORTS = ("torch._dynamo", "torch._inductor.compile_fx")


def main(argv: list[str]) -> int:
    """Compile (or build under a backend), then run once: a crash of either happens here, not
    in the tuner.

    With `--wait [--device D]` the child starts ahead of its job (`tuner.backends.isolation.
    Children`): it imports torch (and makes D's CUDA context), then reads its arguments as one
    JSON line on stdin; at the end of stdin, with no job, it ends.

    The program is one the tuner itself saved (never an upload), so plain `torch.export.load`
    is safe here.
    """
    import torch

    from tuner.backends import registry as backends
    from tuner.graph.capture import example_inputs, to_graph_module

    if argv[:1] == ["--wait"]:
        for name in WARM_IMPORTS:  # what loading a program and compiling import on first use
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        if argv[1:2] == ["--device"]:
            torch.empty(0, device=argv[2])
        line = sys.stdin.readline()
        if not line.strip():
            return 0
        argv = [str(a) for a in json.loads(line)]
    started = time.monotonic()
    program = torch.export.load(argv[0])
    inputs = example_inputs(program)
    if "--probe" in argv:
        backend = argv[argv.index("--probe") + 1]
        with tempfile.TemporaryDirectory(prefix="fxtune-probe-") as work:
            built = backends.build(backend, to_graph_module(program), inputs, Path(work))
            with torch.inference_mode():
                built.runner(*inputs)  # torch.compile and CUDA graphs build on the first call
        report = {"backend": backend, "compile_s": time.monotonic() - started}
    else:
        package = Path(argv[1])
        package = backends.package_aoti(program, package, instrumented="--instrumented" in argv)
        compile_s = time.monotonic() - started
        with torch.inference_mode():
            backends.load_aoti(package)(*inputs)
        report = {"package": str(package), "compile_s": compile_s}
    report["threads"] = torch.get_num_threads()  # what inductor generated its loops for
    print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
