"""The inference runtimes CPU users pick instead of torch's compilers: OpenVINO and ONNX Runtime.

Each is an optional install (`fxtune[openvino]`, `fxtune[onnxruntime]`); where one is present it
is a backend like inductor (`tuner.backends.registry`): a peer on the untouched program and a
whole-model candidate under fxtune's passes, built in a child (`tuner.backends.runtime_build`),
run through `tuner.backends.runtime_runner`, shipped as a data file (`tuner.backends.
runtime_files`). Torch-free and import-free: which runtimes a machine has is read from the
installed distributions' metadata, so a worker can declare them without loading either.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.host.versions import OPTIONAL_RUNTIMES, distribution_version, importable


@dataclass(frozen=True)
class Runtime:
    """One runtime: the module it imports, the distributions that provide it, the pip extra
    that installs it, and the artifact it ships (`format`, with its file suffix)."""

    name: str
    module: str
    distributions: tuple[str, ...]
    extra: str
    format: str
    suffix: str

    def install_hint(self) -> str:
        return f"pip install 'fxtune[{self.extra}]'"


RUNTIMES: dict[str, Runtime] = {
    "openvino": Runtime(
        name="openvino",
        module="openvino",
        distributions=OPTIONAL_RUNTIMES["openvino"],
        extra="openvino",
        format="openvino-ir-zip",  # model.xml and model.bin, stored in one zip
        suffix=".openvino.zip",
    ),
    "onnxruntime": Runtime(
        name="onnxruntime",
        module="onnxruntime",
        distributions=OPTIONAL_RUNTIMES["onnxruntime"],  # its GPU and Intel builds too
        extra="onnxruntime",
        format="onnx",
        suffix=".onnx",
    ),
}

# What building an ONNX file needs besides the runtime: torch.onnx's exporter imports both.
ONNX_EXPORT_MODULES = ("onnx", "onnxscript")


def installed_version(name: str) -> str | None:
    """The runtime's version where it (and what building its artifact needs) is installed."""
    runtime = RUNTIMES[name]
    if not importable(runtime.module):
        return None
    if name == "onnxruntime" and not all(importable(m) for m in ONNX_EXPORT_MODULES):
        return None
    return distribution_version(*runtime.distributions)


def installed_runtimes() -> dict[str, str]:
    """{runtime: version} for every runtime installed here (what a worker declares)."""
    found = {name: installed_version(name) for name in RUNTIMES}
    return {name: version for name, version in found.items() if version is not None}


def is_runtime(backend: str) -> bool:
    return backend in RUNTIMES
