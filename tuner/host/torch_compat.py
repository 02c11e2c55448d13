"""Every private torch API the tuner uses, in one place, with the torch versions it was checked on.

torch's underscore modules, `torch.fx.experimental` and the FX passes marked not backward
compatible change between releases without deprecation. fxtune uses a few of them (fake tensors
for shape propagation, pytree, export's serialisation schema for the safe loader, AOTInductor,
the symbolic-shape context for new dynamic sizes); on a torch it has not been checked on they may
be gone, renamed or, worse, still there with another meaning. So fxtune fails closed: the first
use of any of them on a torch outside `CHECKED_SERIES` raises `UncheckedTorchError` with what
to do. Not at import: a deployment that imports `tuner.deploy.client` on another torch gets its
untuned module and one warning from `load_tuned` (which catches every error), never a crash at
start-up; the `fxtune` commands and the worker check first, and say so.

Experts may override with FXTUNE_ALLOW_UNCHECKED_TORCH=1 (a log line says it was used); the tests
in tests/tuner/host/test_torch_compat.py are then the check to run on that torch.

Each module a tuner file imports from goes through `private()` (or a `lazy()` handle, which calls
it on first attribute use); attributes and op names that are not imports (an op's `_schema`, a
graph's `_codegen`, the `_c10d_functional` ops the overlap pass matches) are listed here too and
checked to exist on this torch by the tests. Files not converted yet (owned by work in
progress) are listed in `used_by` all the same, and a test fails on any private use anywhere in
tuner/ that this registry does not name.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

import torch

from tuner.contract.errors import ALLOW_UNCHECKED_TORCH_ENV, UncheckedTorchError

log = logging.getLogger(__name__)

# Release series whose whole test suite has run (CPU). The GPU image's torch (2.11) joins once
# the GPU issue has run the suite there; pyproject.toml declares the same range.
CHECKED_SERIES: tuple[str, ...] = ("2.13",)
ALLOW_ENV = ALLOW_UNCHECKED_TORCH_ENV

Kind = Literal["module", "attribute", "op"]
__all__ = ["CHECKED_SERIES", "PRIVATE_APIS", "UncheckedTorchError", "check_torch", "private"]


@dataclass(frozen=True)
class PrivateApi:
    """One private torch module (or attribute, or op namespace) and the names fxtune uses."""

    name: str  # a module for kind "module"; "Owner.attr" or an op namespace otherwise
    names: tuple[str, ...]
    used_by: tuple[str, ...]  # files under tuner/
    why: str
    kind: Kind = "module"
    checked_on: tuple[str, ...] = ("2.13.0",)  # torch versions the suite ran these on


PRIVATE_APIS: tuple[PrivateApi, ...] = (
    PrivateApi(
        "torch.utils._pytree",
        ("tree_flatten", "tree_map", "tree_leaves", "tree_structure", "tree_unflatten", "TreeSpec"),
        (
            "graph/capture.py",
            "graph/copying.py",
            "backends/runtime_runner.py",
            "measure/equivalence.py",
            "measure/inputs.py",
            "training/step.py",
            "backends/cuda_graphs.py",
            "search/extract.py",
            "distributed/tune.py",
            "passes/combine_sparse_inputs.py",
            "tuning/train.py",
        ),
        "flattening inputs and outputs the way export does (no public equivalent)",
    ),
    PrivateApi(
        "torch._subclasses.fake_tensor",
        ("FakeTensor", "FakeTensorMode"),
        ("graph/capture.py",),
        "shape propagation in the program's own fake mode and ShapeEnv",
    ),
    PrivateApi(
        "torch._dispatch.python",
        ("enable_python_dispatcher",),
        ("graph/capture.py",),
        "fake propagation of symbolic sizes needs the Python dispatcher",
    ),
    PrivateApi(
        "torch.fx.graph",
        ("_PyTreeCodeGen", "_PyTreeInfo"),
        ("graph/capture.py",),
        "renaming an unlifted graph's inputs keeps its pytree calling convention",
    ),
    PrivateApi(
        "torch.fx.passes.fake_tensor_prop",
        ("FakeTensorProp",),
        ("graph/capture.py",),
        "FX pass marked not backward compatible",
    ),
    PrivateApi(
        "torch.fx.passes.tools_common",
        ("stable_topological_sort",),
        ("passes/apply.py",),
        "FX pass marked not backward compatible",
    ),
    PrivateApi(
        "torch.fx.experimental.symbolic_shapes",
        ("DimDynamic", "StatelessSymbolicContext", "StrictMinMaxConstraint"),
        ("passes/combine_sparse_inputs.py",),
        "a new dynamic size (the combined index count) in the program's ShapeEnv",
    ),
    PrivateApi(
        "torch.utils._sympy.numbers",
        ("int_oo",),
        ("passes/combine_sparse_inputs.py",),
        "an unbounded dynamic range",
    ),
    PrivateApi(
        "torch.utils._sympy.value_ranges",
        ("ValueRanges",),
        ("passes/combine_sparse_inputs.py",),
        "the range of a new dynamic size",
    ),
    PrivateApi(
        "torch.utils._python_dispatch",
        ("TorchDispatchMode",),
        ("profiling/counting.py", "loading/op_costs.py"),
        "counting the ATen ops one iteration dispatches; pricing the ops a node runs",
    ),
    PrivateApi(
        "torch._inductor",
        ("aoti_compile_and_package", "aoti_load_package"),
        ("backends/registry.py",),
        "AOTInductor packages (the inductor backend)",
    ),
    PrivateApi(
        "torch._inductor.config",
        ("cpp",),
        ("profiling/counting.py", "profiling/profile.py", "backends/inductor_settings.py"),
        "kernel ranges in compiled code (cpp.enable_kernel_profile); which settings this "
        "inductor has (a missing one is not offered)",
    ),
    PrivateApi(
        "torch._ops",
        ("OpOverload",),
        ("passes/apply.py", "graph/nodes.py", "passes/overlap_comm_compute.py"),
        "telling ATen calls from other call_function targets",
    ),
    PrivateApi(
        "torch._export.serde.schema",
        ("ExportedProgram", "PayloadConfig", "ScalarType", "Layout", "SCHEMA_VERSION"),
        ("loading/load.py", "loading/program_schema.py"),
        "the safe loader reads the archive's JSON against export's own schema",
    ),
    PrivateApi(
        "torch._export.serde.serialize",
        ("GraphModuleDeserializer",),
        ("loading/load.py", "checks/inspect.py"),  # the warm checker preloads it
        "the safe loader rebuilds the program without pickle",
    ),
    PrivateApi(
        "torch._export.serde.union",
        ("_Union",),
        ("loading/program_schema.py",),
        "the schema's tagged unions",
    ),
    PrivateApi(
        "OpOverload._schema",
        ("arguments", "returns"),
        (
            "loading/bounds.py",
            "loading/op_costs.py",
            "graph/nodes.py",
            "passes/fuse_horizontal_pointwise.py",
            "passes/overlap_comm_compute.py",
        ),
        "argument and alias information of an ATen op",
        kind="attribute",
    ),
    PrivateApi(
        "Graph._codegen",
        ("pytree_info", "_tracer_cls"),
        ("graph/capture.py", "graph/copying.py"),
        "an unlifted graph's calling convention (copied sharing its tree specs)",
        kind="attribute",
    ),
    PrivateApi(
        "torch.ops._c10d_functional",
        ("all_to_all_single", "wait_tensor"),
        (
            "passes/overlap_comm_compute.py",
            "distributed/overlap_profile.py",
            "loading/op_policy.py",
        ),
        "the functional collectives an exported sharded program calls",
        kind="op",
    ),
    PrivateApi(
        "torch.ops.aten",
        ("_assert_scalar", "_unsafe_view"),
        ("passes/combine_sparse_inputs.py", "passes/fuse_horizontal_linear.py"),
        "underscore ATen ops that export emits and the passes match",
        kind="op",
    ),
)
MODULES: dict[str, PrivateApi] = {a.name: a for a in PRIVATE_APIS if a.kind == "module"}


def series(version: str) -> str:
    """'2.13' for '2.13.0+cpu', '2.13.0a0+git1234' or '2.13.1'."""
    major, minor, *_ = version.split("+")[0].split(".")
    return f"{major}.{minor}"


def check_torch(version: str | None = None) -> None:
    """Raise UncheckedTorchError unless `version` (default: this torch) is of a checked series
    or the expert override is set."""
    version = version or torch.__version__
    if series(version) in CHECKED_SERIES:
        return
    if os.environ.get(ALLOW_ENV) == "1":
        _warn_override(version)
        return
    checked = ", ".join(CHECKED_SERIES)
    raise UncheckedTorchError(
        f"fxtune was checked on torch {checked}; this is torch {version}. fxtune uses private "
        f"torch APIs (tuner/host/torch_compat.py) that change between releases, so it refuses "
        "rather "
        f"than guess: install torch {checked} (pip install 'torch=={CHECKED_SERIES[-1]}.*'), or "
        f"set {ALLOW_ENV}=1 to try anyway (then run tests/tuner/host/test_torch_compat.py first)"
    )


@functools.cache
def _warn_override(version: str) -> None:
    log.warning("fxtune on unchecked torch %s (%s=1): private APIs may differ", version, ALLOW_ENV)


@functools.cache
def _checked() -> None:
    check_torch()


def private(module: str) -> ModuleType:
    """Import one registered private torch module, after the version check."""
    if module not in MODULES:
        raise KeyError(f"{module} is not registered in tuner/host/torch_compat.py")
    _checked()
    return importlib.import_module(module)


class lazy:
    """A handle on a registered private module that imports it (and checks the version) on
    first attribute use, so merely importing a tuner module never fails on another torch.
    Resolved attributes are kept, so later uses cost a plain attribute lookup."""

    def __init__(self, module: str) -> None:
        if module not in MODULES:
            raise KeyError(f"{module} is not registered in tuner/host/torch_compat.py")
        self._module = module

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        if attr not in MODULES[self._module].names:
            raise AttributeError(f"{self._module}.{attr} is not registered in torch_compat")
        value = getattr(private(self._module), attr)
        setattr(self, attr, value)
        return value

    def __repr__(self) -> str:
        return f"<private torch module {self._module}>"


pytree = lazy("torch.utils._pytree")
fake_tensor = lazy("torch._subclasses.fake_tensor")
fx_graph = lazy("torch.fx.graph")
fake_tensor_prop = lazy("torch.fx.passes.fake_tensor_prop")
torch_ops = lazy("torch._ops")
python_dispatch = lazy("torch.utils._python_dispatch")
inductor = lazy("torch._inductor")
