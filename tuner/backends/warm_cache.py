"""One tiny AOTInductor build, to leave a temp folder as warm as a machine that compiled before.

A machine's first AOTInductor build pays for what later builds reuse: inductor probes the
compiler once per inductor cache folder (six tiny shared objects, about 7 s on this project's 2
cores), and g++ makes two precompiled headers (about 12 s, 300 MB) in
`<temp folder>/torchinductor_<user>/precompiled_headers`, wherever TORCHINDUCTOR_CACHE_DIR points.
A folder warmed once by this build is copied for each job (`worker.warm_temp`) or each zoo run
(`bench.zoo`); nothing of any model is in it.

`python -m tuner.backends.warm_cache OUT.pt2` builds into the temp folder and inductor cache the
environment names.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from tuner.backends.registry import package_aoti


def build_tiny_package(path: Path) -> Path:
    model = torch.nn.Linear(8, 8).eval()
    return package_aoti(torch.export.export(model, (torch.randn(2, 8),)), path)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m tuner.backends.warm_cache OUT.pt2", file=sys.stderr)
        return 2
    build_tiny_package(Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
