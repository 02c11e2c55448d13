"""Running passes over a graph: all sites, or exactly the sites a tuned config accepted."""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from torch import fx
from torch.export import ExportedProgram

from tuner.contract.errors import PassError
from tuner.graph.capture import Inputs, example_inputs, refresh_meta, to_graph_module, to_program
from tuner.graph.nodes import is_training
from tuner.graph.sites import Site
from tuner.host.torch_compat import private, torch_ops
from tuner.passes import get_pass

Packer = Callable[[Inputs], Inputs]
# (pass name, site ids to rewrite or None for every site the pass finds)
Step = tuple[str, Collection[str] | None]


@dataclass
class Transformed:
    """A rewritten module with what is needed to call it and to export it again."""

    gm: fx.GraphModule
    inputs: Inputs
    applied: list[Site] = field(default_factory=list)
    packers: list[Packer] = field(default_factory=list)

    def pack(self, inputs: Inputs) -> Inputs:
        """Turn inputs of the original signature into this module's (see combine_sparse_inputs)."""
        for packer in self.packers:
            inputs = packer(inputs)
        return inputs

    def to_program(self) -> ExportedProgram:
        return to_program(self.gm, self.inputs)


def cleanup(gm: fx.GraphModule) -> None:
    """Restore the invariants passes rely on: sorted, no dead nodes, no orphaned weights."""
    private("torch.fx.passes.tools_common").stable_topological_sort(gm)
    gm.graph.eliminate_dead_code()
    used = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in list(gm.named_buffers()) + list(gm.named_parameters()):
        if name not in used:
            owner_path, _, attr = name.rpartition(".")
            owner = gm.get_submodule(owner_path) if owner_path else gm
            delattr(owner, attr)
    gm.graph.lint()
    gm.recompile()


def apply_steps(gm: fx.GraphModule, inputs: Inputs, steps: Sequence[Step]) -> Transformed:
    """Apply passes in order to `gm` (in place). Later passes see what earlier ones made."""
    result = Transformed(gm, tuple(inputs))
    training = is_training(gm)
    for pass_name, wanted in steps:
        graph_pass = get_pass(pass_name)
        if training and not graph_pass.train_safe:
            raise PassError(f"pass {pass_name!r} is not valid in a training step")
        found = graph_pass.find_sites(gm)
        chosen = found if wanted is None else [m for s in found if (m := s.matching(wanted))]
        if not chosen:
            continue
        for site in chosen:
            packer = graph_pass.input_packer(gm, site)
            graph_pass.rewrite(gm, site)
            if packer is not None:
                result.inputs = packer(result.inputs)
                result.packers.append(packer)
        cleanup(gm)
        refresh_meta(gm, result.inputs)
        result.applied.extend(chosen)
    return result


def apply_passes(
    program: ExportedProgram,
    pass_names: Sequence[str],
    site_ids: Collection[str] | None = None,
    *,
    train: bool = False,
) -> Transformed:
    """Every site of each named pass (or only `site_ids`), in the order given."""
    gm = to_graph_module(program, train=train)
    return apply_steps(gm, example_inputs(program), [(p, site_ids) for p in pass_names])


def count_ops(gm: fx.GraphModule) -> int:
    """Calls in the graph that dispatch work (getitem and views of tuples excluded)."""
    return sum(
        1
        for n in gm.graph.nodes
        if n.op == "call_function"
        and n.target is not operator.getitem
        and isinstance(n.target, torch_ops.OpOverload)
    )
