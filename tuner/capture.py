"""Between `torch.export` programs and the FX GraphModules the passes rewrite.

Passes work on the unlifted module (`program.module()`): parameters are `get_attr` nodes, so a
pass can add a stacked or folded weight with one `register_buffer`. Re-exporting that module
lifts everything back into a program that saves and loads with plain torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.export import ExportedProgram
from torch.fx.graph import _PyTreeCodeGen, _PyTreeInfo
from torch.fx.passes.fake_tensor_prop import FakeTensorProp
from torch.utils import _pytree as pytree

Inputs = tuple[Any, ...]


def export_module(
    module: torch.nn.Module, args: Sequence[Any], kwargs: dict[str, Any] | None = None
) -> ExportedProgram:
    """Export an eager module with its example inputs; the inputs travel inside the program."""
    return torch.export.export(module, tuple(args), kwargs=kwargs or {}, strict=False)


def save_program(program: ExportedProgram, path: Path | str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, path)
    return path


def example_inputs(program: ExportedProgram) -> Inputs:
    """The positional sample inputs stored with the program (kwargs are not supported)."""
    stored = program.example_inputs
    if stored is None:
        raise ValueError("the program carries no example inputs; export it with sample inputs")
    args, kwargs = stored
    if kwargs:
        raise ValueError("programs with keyword inputs are not supported; pass inputs by position")
    return tuple(args)


def to_graph_module(program: ExportedProgram) -> fx.GraphModule:
    """An editable copy of the program: unlifted, guard check removed, `meta["val"]` everywhere."""
    gm = program.module()
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    gm.delete_all_unused_submodules()
    gm.recompile()
    refresh_meta(gm, example_inputs(program))
    return gm


def refresh_meta(gm: fx.GraphModule, inputs: Inputs) -> None:
    """Recompute `meta["val"]` (fake tensors: shape, dtype, strides) on every node."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake = [mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in inputs]
    FakeTensorProp(gm, mode).propagate(*fake)


def to_program(gm: fx.GraphModule, inputs: Inputs) -> ExportedProgram:
    """Re-export a rewritten module; the result saves with `torch.export.save`."""
    return torch.export.export(gm, tuple(inputs), strict=False)


def set_positional_inputs(gm: fx.GraphModule, names: Sequence[str]) -> None:
    """Make `gm(*args)` take one positional argument per name, after a pass changed the inputs.

    The unlifted module flattens its arguments with the input spec recorded at export; once a
    pass adds or removes placeholders, that spec (and the signature) must describe the new tuple.
    `names` are the placeholder targets in graph order.
    """
    targets = [str(n.target) for n in gm.graph.nodes if n.op == "placeholder"]
    if list(names) != targets:
        raise ValueError(f"inputs {list(names)} do not match the graph's placeholders {targets}")
    codegen = gm.graph._codegen
    if isinstance(codegen, _PyTreeCodeGen):
        in_spec = pytree.tree_structure((tuple(names), {}))
        out_spec = codegen.pytree_info.out_spec
        codegen.pytree_info = _PyTreeInfo(list(names), in_spec, out_spec)
    gm.recompile()
