"""Between `torch.export` programs and the FX GraphModules the passes rewrite.

Passes work on the unlifted module (`program.module()`): parameters are `get_attr` nodes, so a
pass can add a stacked or folded weight with one `register_buffer`. Re-exporting that module
lifts everything back into a program that saves and loads with plain torch.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import fx
from torch.export import ExportedProgram

from tuner.contract.errors import InputError
from tuner.graph.nodes import TRAIN_KEY
from tuner.graph.shapes import (
    SPEC_KEY,
    check_still_dynamic,
    dynamic_shapes_for,
    spec_from_placeholders,
)
from tuner.host.torch_compat import fake_tensor, fake_tensor_prop, fx_graph, private, pytree

if TYPE_CHECKING:
    from torch._subclasses.fake_tensor import FakeTensorMode

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


def on_device(program: ExportedProgram, device: torch.device | str) -> ExportedProgram:
    """`program` moved, in place, to `device`: weights, constants, sample inputs and every device
    baked into the graph at export (an attention mask built with `device=cpu`), by torch.export's
    own pass. `module.to()` would move weights only, and the first such op would mix devices.
    In place because a deep copy renames placeholders called `input` and breaks the program."""
    from torch.export.passes import move_to_device_pass

    target = torch.device(device)
    if target.type == "cuda" and target.index is None:  # torch 2.11 tells "cuda" from "cuda:0"
        target = torch.device("cuda", torch.cuda.current_device())
    return move_to_device_pass(program, str(target))


def example_inputs(program: ExportedProgram) -> Inputs:
    """The positional sample inputs stored with the program (kwargs are not supported)."""
    stored = program.example_inputs
    if stored is None:
        raise InputError("the program carries no example inputs; export it with sample inputs")
    args, kwargs = stored
    if kwargs:
        raise InputError("programs with keyword inputs are not supported; pass inputs by position")
    return tuple(args)


def to_graph_module(program: ExportedProgram, *, train: bool = False) -> fx.GraphModule:
    """An editable copy of the program: unlifted, guard check removed, `meta["val"]` everywhere.

    `train` marks it as a training step (`tuner.graph.nodes.TRAIN_KEY`): passes then keep the
    parameters as the trainable leaves, and only passes that are `train_safe` apply.

    The guard check goes because fxtune checks inputs itself (`tuner.graph.shapes.ShapeSpec`), and
    because a rewritten graph must be re-exported anyway. The placeholders keep the program's
    symbolic sizes, so every node's metadata (and every pass) sees `s0`, not the example's 32;
    the shapes the program serves ride along as `gm.meta[SPEC_KEY]`.
    """
    gm = program.module()
    inputs = example_inputs(program)
    gm.meta[SPEC_KEY] = spec_from_placeholders(program, gm, inputs)
    gm.meta[TRAIN_KEY] = train
    for node in list(gm.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn":
            gm.graph.erase_node(node)
    # Without its `_guards_fn`, the unlifted module's input hook falls back to checking every
    # symbolic size with sympy on each call (3 ms a call on the dynamic recsys, more than the
    # model): the original timed as the baseline would carry a cost no candidate has and no
    # deployment pays. `validate_inputs` is the module's own switch for that check.
    if hasattr(gm, "validate_inputs"):
        gm.validate_inputs = False
    gm.delete_all_unused_submodules()
    gm.recompile()
    refresh_meta(gm, inputs)
    return gm


@functools.cache
def _fake_prop() -> type:
    """A class built on first use: its base is private torch (tuner/host/torch_compat.py)."""

    class _FakeProp(fake_tensor_prop.FakeTensorProp):
        """FakeTensorProp that reads weights as fakes of the same mode: a real weight meeting a
        symbolic activation (an affine broadcast to (s0, N, D)) cannot be expanded
        symbolically."""

        def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
            value = super().get_attr(target, args, kwargs)
            if isinstance(value, torch.Tensor) and not isinstance(value, fake_tensor.FakeTensor):
                return self._mode.from_tensor(value, static_shapes=True)
            return value

    return _FakeProp


def _python_dispatcher() -> contextlib.AbstractContextManager[Any]:
    """What export traces under: some meta kernels (addcmul, baddbmm) broadcast a symbolic size
    only through the Python dispatcher. Private in torch; without it, symbolic propagation of
    those ops fails, and the pass that made them is refused (fail closed)."""
    try:
        enable_python_dispatcher = private("torch._dispatch.python").enable_python_dispatcher
    except (ImportError, AttributeError):
        return contextlib.nullcontext()
    return enable_python_dispatcher()


def _fake_mode_of(gm: fx.GraphModule) -> FakeTensorMode | None:
    """The fake mode (with its ShapeEnv) the placeholders' symbolic values belong to."""
    for node in gm.graph.find_nodes(op="placeholder"):
        v = node.meta.get("val")
        mode = getattr(v, "fake_mode", None)
        if isinstance(mode, fake_tensor.FakeTensorMode):
            return mode
    return None


def refresh_meta(gm: fx.GraphModule, inputs: Inputs) -> None:
    """Recompute `meta["val"]` (fake tensors: shape, dtype, strides) on every node.

    Placeholders that already carry a fake value keep it (with its symbolic sizes), so the
    propagation runs in their ShapeEnv and every node gets symbolic shapes; placeholders a pass
    added get a fake of the real input. Weights are real tensors read through `get_attr`, hence
    `allow_non_fake_inputs` for the duration.
    """
    mode = _fake_mode_of(gm)
    if mode is None:
        mode = fake_tensor.FakeTensorMode(allow_non_fake_inputs=True)
    fake: list[Any] = []
    for node, x in zip(gm.graph.find_nodes(op="placeholder"), inputs, strict=True):
        v = node.meta.get("val")
        if isinstance(x, torch.Tensor) and getattr(v, "fake_mode", None) is mode:
            fake.append(v)
        elif isinstance(x, torch.Tensor):
            fake.append(mode.from_tensor(x))
        else:
            fake.append(x)
    allowed = mode.allow_non_fake_inputs
    mode.allow_non_fake_inputs = True
    try:
        with _python_dispatcher():
            _fake_prop()(gm, mode).propagate_dont_convert_inputs(*fake)
    finally:
        mode.allow_non_fake_inputs = allowed
    check_still_dynamic(gm)


def to_program(gm: fx.GraphModule, inputs: Inputs) -> ExportedProgram:
    """Re-export a rewritten module; the result saves with `torch.export.save`.

    A module captured from a dynamic program is exported with the original's dynamic
    dimensions and ranges (read from its placeholders), so it serves every size the original
    served; export itself fails if a rewrite specialised one of them.
    """
    return torch.export.export(
        gm, tuple(inputs), dynamic_shapes=dynamic_shapes_for(gm), strict=False
    )


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
    if isinstance(codegen, fx_graph._PyTreeCodeGen):
        in_spec = pytree.tree_structure((tuple(names), {}))
        out_spec = codegen.pytree_info.out_spec
        codegen.pytree_info = fx_graph._PyTreeInfo(list(names), in_spec, out_spec)
    gm.recompile()
