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
from typing import Any

from tuner.backends.child_protocol import ANSWER

# Imported by a child started ahead while it waits: torch.export.load imports dynamo (1.4 s
# here), an AOTInductor compile inductor. Private modules, so an import that fails is skipped.
WARM_IMPORTS = ("torch._dynamo", "torch._inductor.compile_fx")


def job(argv: list[str]) -> dict[str, Any]:
    """One job: compile (or build under a backend, or write a runtime's artifact), then run
    the result once; its report.

    The program is one the tuner itself saved (never an upload), so plain `torch.export.load`
    is safe here.
    """
    import torch

    from tuner.backends import registry as backends
    from tuner.graph.capture import example_inputs, to_graph_module

    started = time.monotonic()
    program = torch.export.load(argv[0])
    inputs = example_inputs(program)
    if "--runtime" in argv:
        from tuner.backends.runtime_build import load_runner, write_artifact

        at = argv.index("--runtime")
        runtime, artifact = argv[at + 1], Path(argv[at + 2])
        write_artifact(runtime, program, artifact)
        compile_s = time.monotonic() - started
        threads = torch.get_num_threads()
        runner = load_runner(runtime, artifact, program.call_spec.out_spec, threads)
        runner(*inputs)  # a runtime that crashes on its own artifact crashes here
        report: dict[str, Any] = {"artifact": str(artifact), "compile_s": compile_s}
    elif "--probe" in argv:
        backend = argv[argv.index("--probe") + 1]
        with tempfile.TemporaryDirectory(prefix="fxtune-probe-") as work:
            built = backends.build(backend, to_graph_module(program), inputs, Path(work))
            with torch.inference_mode():
                built.runner(*inputs)  # torch.compile and CUDA graphs build on the first call
        report = {"backend": backend, "compile_s": time.monotonic() - started}
    else:
        package = Path(argv[1])
        settings = argv[argv.index("--settings") + 1] if "--settings" in argv else None
        instrumented = "--instrumented" in argv
        package = backends.package_aoti(
            program, package, instrumented=instrumented, settings=settings
        )
        compile_s = time.monotonic() - started
        with torch.inference_mode():
            backends.load_aoti(package)(*inputs)
        report = {"package": str(package), "compile_s": compile_s}
    report["threads"] = torch.get_num_threads()  # what inductor generated its loops for
    return report


def serve() -> int:
    """Jobs one per line on stdin, each answered by one JSON line on stdout, until stdin ends
    (`tuner.backends.isolation.Children.serve`: a child that builds runtime artifacts for a
    whole run, so each build does not pay for starting Python and importing torch). A job
    that raises is answered with {"error": ...} and the next one is served; one that crashes
    or hangs ends this process, and the tuner starts another for the next job."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            report = job([str(a) for a in json.loads(line)])
        except Exception as exc:
            message = " ".join(f"{type(exc).__name__}: {exc}".split())[:2000]
            report = {"error": message}
        print(ANSWER + json.dumps(report), flush=True)
    return 0


def main(argv: list[str]) -> int:
    """With `--wait [--device D]` the child starts ahead of its job (`tuner.backends.isolation.
    Children`): it imports torch (and makes D's CUDA context), then reads its arguments as one
    JSON line on stdin; at the end of stdin, with no job, it ends. With `--serve` it serves
    jobs until stdin ends (`serve`)."""
    import torch

    if argv[:1] in (["--wait"], ["--serve"]):
        for name in WARM_IMPORTS:  # what loading a program and compiling import on first use
            with contextlib.suppress(ImportError):
                importlib.import_module(name)
        if argv[:1] == ["--serve"]:
            return serve()
        if argv[1:2] == ["--device"]:
            torch.empty(0, device=argv[2])
        line = sys.stdin.readline()
        if not line.strip():
            return 0
        argv = [str(a) for a in json.loads(line)]
    print(json.dumps(job(argv)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
