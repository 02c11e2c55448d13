"""What `fxtune --version` reports: fxtune's version, torch's, and which optional runtimes are
installed, all read from the installed distributions' metadata. Nothing is imported (torch
alone takes seconds), so the answer is instant and cannot fail on a broken install of either."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform

# Each optional runtime's module and the distributions that install it (the GPU and Intel
# builds of ONNX Runtime ship the same module); `tuner.backends.runtimes` runs them.
OPTIONAL_RUNTIMES: dict[str, tuple[str, ...]] = {
    "openvino": ("openvino",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
}
NOT_INSTALLED = "not installed"


def distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None  # finds, does not import
    except (ImportError, ValueError):
        return False


def runtime_versions() -> dict[str, str]:
    """{runtime: its version, or "not installed"} for each optional runtime."""
    found = {}
    for module, distributions in OPTIONAL_RUNTIMES.items():
        version = distribution_version(*distributions) if importable(module) else None
        found[module] = version or NOT_INSTALLED
    return found


def version_lines() -> list[str]:
    lines = [
        f"fxtune {distribution_version('fxtune') or 'unknown (not installed as a package)'}",
        f"torch {distribution_version('torch') or NOT_INSTALLED}",
        f"python {platform.python_version()}",
    ]
    lines += [f"{name} {version}" for name, version in runtime_versions().items()]
    return lines
